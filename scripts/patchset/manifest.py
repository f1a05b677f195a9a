"""The pin manifest (pin.toml) and the series file of one patch set."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Exit, PatchSetError

MANIFEST_NAME = "pin.toml"
SERIES_NAME = "series"
BASE_STEP = "base"
# Keys of [sglang] that record what the base wheel's metadata pins.
REQUIRES_KEYS = ("torch", "transformers")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(data: bytes) -> str:
    """The id `git hash-object` gives data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def step_of(patch_name: str) -> str:
    """The step a patch brings the tree to: its number, e.g. '0001'."""
    return patch_name.split("-", 1)[0]


@dataclass(frozen=True)
class WheelPin:
    """One released sglang wheel, named and hashed."""

    version: str
    wheel: str
    sha256: str


@dataclass
class PinManifest:
    """What the series was made against and what each step must produce."""

    base: WheelPin
    tag: str
    upstream_fixed: WheelPin
    patch_hashes: dict[str, str]
    # path -> {step -> git blob id}, steps in series order starting with "base"
    blobs: dict[str, dict[str, str]]
    # release -> {path -> git blob id}, to name a base that does not match
    known_releases: dict[str, dict[str, str]] = field(default_factory=dict)
    first_fixed_release: str = "0.5.19"
    # package -> version the base wheel's metadata pins (torch, transformers)
    base_requires: dict[str, str] = field(default_factory=dict)
    # release -> its [same-files] table: other wheels with the base's three files
    same_files: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        return list(self.blobs)

    @property
    def steps(self) -> list[str]:
        return [BASE_STEP] + [step_of(name) for name in self.patch_hashes]

    def blobs_at(self, step: str) -> dict[str, str]:
        return {path: by_step[step] for path, by_step in self.blobs.items()}

    @classmethod
    def load(cls, path: Path) -> PinManifest:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PatchSetError(
                Exit.PATCHSET_INVALID,
                f"pin manifest {path} does not exist",
                "pass --patch-set with a folder under patches/ that holds pin.toml",
            ) from None
        except tomllib.TOMLDecodeError as err:
            raise PatchSetError(
                Exit.PATCHSET_INVALID,
                f"pin manifest {path} is not valid TOML: {err}",
                "restore it with `git checkout -- patches/`, or regenerate it "
                "with scripts/export-patches",
            ) from None
        try:
            sglang = data["sglang"]
            upstream = data["upstream-fixed"]
            return cls(
                base=WheelPin(sglang["version"], sglang["wheel"], sglang["sha256"]),
                tag=sglang["tag"],
                upstream_fixed=WheelPin(upstream["version"], upstream["wheel"], upstream["sha256"]),
                first_fixed_release=upstream["version"],
                patch_hashes=dict(data["patches"]),
                blobs={path: dict(steps) for path, steps in data["blobs"].items()},
                known_releases={
                    release: dict(files)
                    for release, files in data.get("known-releases", {}).items()
                },
                base_requires={name: sglang[name] for name in REQUIRES_KEYS if name in sglang},
                same_files={
                    release: dict(table) for release, table in data.get("same-files", {}).items()
                },
            )
        except KeyError as err:
            raise PatchSetError(
                Exit.PATCHSET_INVALID,
                f"pin manifest {path} lacks the key {err}",
                "regenerate it with scripts/export-patches",
            ) from None

    def dumps(self) -> str:
        """The manifest as TOML, in a fixed order so rewriting it is stable."""
        lines = [
            "# Pin manifest of this patch series. scripts/export-patches rewrites",
            "# [patches] and [blobs]; the rest is edited by hand.",
            "",
            "[sglang]",
            f'version = "{self.base.version}"',
            f'tag = "{self.tag}"',
            f'wheel = "{self.base.wheel}"',
            f'sha256 = "{self.base.sha256}"',
        ]
        lines += [f'{name} = "{version}"' for name, version in self.base_requires.items()]
        if self.same_files:
            lines += [
                "",
                "# Other releases whose three files are byte-identical to this base's;",
                "# the same series serves them.",
            ]
            for number, (release, table) in enumerate(self.same_files.items()):
                lines += [""] * (number > 0) + [f'[same-files."{release}"]']
                lines += [f'{key} = "{value}"' for key, value in table.items()]
        lines += [
            "",
            "# The first release that carries both fixes; scripts/review compares",
            "# our patched functions with it.",
            "[upstream-fixed]",
            f'version = "{self.upstream_fixed.version}"',
            f'wheel = "{self.upstream_fixed.wheel}"',
            f'sha256 = "{self.upstream_fixed.sha256}"',
            "",
            "# sha256 of each patch file, in series order.",
            "[patches]",
        ]
        lines += [f'"{name}" = "{digest}"' for name, digest in self.patch_hashes.items()]
        lines += [
            "",
            "# git blob ids (git hash-object) of the files the series touches:",
            "# before the series, then after each patch.",
            "[blobs]",
        ]
        lines += [f'"{path}" = {_inline_table(by_step)}' for path, by_step in self.blobs.items()]
        if self.known_releases:
            lines += [
                "",
                "# The same files in other sglang releases, so that a base that does",
                "# not match can be named.",
                "[known-releases]",
            ]
            lines += [
                f'"{release}" = {_inline_table(files)}'
                for release, files in self.known_releases.items()
            ]
        return "\n".join(lines) + "\n"


def _inline_table(mapping: dict[str, str]) -> str:
    pairs = ", ".join(f'"{key}" = "{value}"' for key, value in mapping.items())
    return f"{{ {pairs} }}"


def require_folder(folder: Path) -> None:
    """Refuse a patch set folder that does not exist."""
    if not folder.is_dir():
        raise PatchSetError(
            Exit.PATCHSET_INVALID,
            f"patch set folder {folder} does not exist",
            "pass --patch-set with a folder under patches/",
        )


@dataclass(frozen=True)
class Series:
    """A patch set folder: its series file, its patches and its manifest."""

    folder: Path
    patch_names: list[str]
    manifest: PinManifest

    @property
    def patch_paths(self) -> list[Path]:
        return [self.folder / name for name in self.patch_names]

    @classmethod
    def load(cls, folder: Path) -> Series:
        """Read the series and its manifest without checking patch hashes."""
        require_folder(folder)
        manifest = PinManifest.load(folder / MANIFEST_NAME)
        series_file = folder / SERIES_NAME
        if not series_file.is_file():
            raise PatchSetError(
                Exit.PATCHSET_INVALID,
                f"{series_file} does not exist",
                "regenerate it with scripts/export-patches",
            )
        names = [
            line.strip()
            for line in series_file.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        return cls(folder=folder, patch_names=names, manifest=manifest)

    def verify(self) -> None:
        """Refuse a series whose patch files differ from the manifest's hashes."""
        expected = list(self.manifest.patch_hashes)
        if self.patch_names != expected:
            raise PatchSetError(
                Exit.PATCHSET_INVALID,
                f"{self.folder / SERIES_NAME} lists {self.patch_names}, but the "
                f"manifest pins {expected}",
                "restore the patch set with `git checkout -- patches/`, or "
                "regenerate it with scripts/export-patches",
            )
        for path in self.patch_paths:
            if not path.is_file():
                raise PatchSetError(
                    Exit.PATCHSET_INVALID,
                    f"patch {path} is named in the series but does not exist",
                    "restore it with `git checkout -- patches/`",
                )
            actual = sha256_of(path)
            pinned = self.manifest.patch_hashes[path.name]
            if actual != pinned:
                raise PatchSetError(
                    Exit.PATCHSET_INVALID,
                    f"patch {path.name} has sha256 {actual}, but the manifest "
                    f"pins {pinned}: the file was changed after it was exported",
                    "restore it with `git checkout -- patches/`, or, if the change "
                    "is wanted, make it on the patched branch and run "
                    "scripts/export-patches",
                )
