"""The pin manifest (pin.toml) and the series file of one patch set."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import BackportError, Exit

MANIFEST_NAME = "pin.toml"
SERIES_NAME = "series"
BASE_STEP = "base"


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def git_blob_id(data: bytes) -> str:
    """The id `git hash-object` gives data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def step_of(patch_name: str) -> str:
    """The step a patch brings the tree to: its number, e.g. '0001'."""
    return patch_name.split("-", 1)[0]


def release_key(release: str) -> tuple[int, ...]:
    """Sort key for sglang release names: 0.5.13 < 0.5.13.post1 < 0.5.14."""
    return tuple(int(part) for part in re.findall(r"\d+", release))


@dataclass(frozen=True)
class WheelPin:
    """One released sglang wheel, named and hashed."""

    version: str
    wheel: str
    sha256: str


@dataclass(frozen=True)
class ReleasePin:
    """A release a patch set serves: its wheel, its git tag and what it pins."""

    wheel: WheelPin
    tag: str
    torch: str = ""
    transformers: str = ""

    @classmethod
    def from_table(cls, toml: TomlFile, keys: tuple[str, ...], version: str) -> ReleasePin:
        return cls(
            toml.wheel_pin(keys, version),
            toml.text((*keys, "tag")),
            toml.text((*keys, "torch"), default=""),
            toml.text((*keys, "transformers"), default=""),
        )


_REQUIRED: Any = object()
BLOB_ID = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# PEP 427: name-version-python-abi-platform.whl (no build tag: the pins name none)
WHEEL_NAME = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)-(?P<python>[a-z]+\d+)-[^-]+-[^-]+\.whl$"
)
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def spell_key(keys: tuple[str, ...]) -> str:
    """A key path as TOML writes it: blobs."python/sglang/x.py".0002."""
    return ".".join(k if _BARE_KEY.match(k) else json.dumps(k) for k in keys)


@dataclass(frozen=True)
class TomlFile:
    """A parsed TOML file read by key path; a missing or wrong value is refused
    (exit 6) with the key and the file, never a KeyError."""

    path: Path
    data: dict[str, Any]
    repair: str  # the next step for a damaged file

    @classmethod
    def load(cls, path: Path, what: str, missing: str, repair: str) -> TomlFile:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BackportError(
                Exit.PATCHSET_INVALID, f"{what} {path} does not exist", missing
            ) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise BackportError(
                Exit.PATCHSET_INVALID, f"{what} {path} is not valid TOML: {err}", repair
            ) from None
        return cls(path, data, repair)

    def refuse(self, keys: tuple[str, ...], problem: str) -> BackportError:
        return BackportError(
            Exit.PATCHSET_INVALID, f"{self.path}: {spell_key(keys)} {problem}", self.repair
        )

    def value(self, keys: tuple[str, ...], kind: type, default: Any = _REQUIRED) -> Any:
        node: Any = self.data
        for depth, key in enumerate(keys):
            if not isinstance(node, dict):
                raise self.refuse(keys[:depth], f"is {_kind(node)}, not a table")
            if key not in node:
                if default is not _REQUIRED:
                    return default
                raise self.refuse(keys[: depth + 1], "is missing")
            node = node[key]
        if not isinstance(node, kind) or isinstance(node, bool) is not (kind is bool):
            raise self.refuse(keys, f"is {_kind(node)}, not {_KINDS[kind]}")
        return node

    def table(self, keys: tuple[str, ...], optional: bool = False) -> dict[str, Any]:
        return dict(self.value(keys, dict, {} if optional else _REQUIRED))

    def text(
        self,
        keys: tuple[str, ...],
        pattern: re.Pattern[str] | None = None,
        what: str = "",
        default: Any = _REQUIRED,
    ) -> str:
        text = self.value(keys, str, default)
        if pattern is not None and not pattern.match(text):
            raise self.refuse(keys, f"= {json.dumps(text)} is not {what}")
        return str(text)

    def number(self, keys: tuple[str, ...]) -> int:
        return int(self.value(keys, int))

    def wheel_pin(self, keys: tuple[str, ...], version: str) -> WheelPin:
        """The table's wheel (a wheel file name of that sglang version) and sha256."""
        wheel = self.text((*keys, "wheel"), WHEEL_NAME, "a wheel file name (PEP 427)")
        name = WHEEL_NAME.match(wheel)
        assert name is not None
        if (name["name"], name["version"]) != ("sglang", version):
            raise self.refuse(
                (*keys, "wheel"),
                f"= {json.dumps(wheel)} is not a wheel of sglang {version}",
            )
        return WheelPin(version, wheel, self.text((*keys, "sha256"), SHA256, "a sha256"))


_KINDS: dict[type, str] = {dict: "a table", str: "a string", int: "an integer", list: "a list"}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return next((name for kind, name in _KINDS.items() if isinstance(value, kind)), "a value")


@dataclass
class PinManifest:
    """What the series was made against and what each step must produce."""

    release: ReleasePin
    upstream_fixed: WheelPin
    patch_hashes: dict[str, str]
    # path -> {step -> git blob id}, steps in series order starting with "base"
    blobs: dict[str, dict[str, str]]
    # release -> {path -> git blob id}, to name a base that does not match
    known_releases: dict[str, dict[str, str]] = field(default_factory=dict)
    # other releases whose touched files are byte-identical: the series serves them too
    same_files: dict[str, ReleasePin] = field(default_factory=dict)
    # the line that fix B adds, and the function it goes in; a tree holding it needs no patch
    fix_marker: str = ""
    fix_function: str = ""
    # upstream pull requests of the fixes, by the step that brings each
    upstream_prs: dict[str, int] = field(default_factory=dict)
    # PEP 440 local version label of the patched wheel (scripts/build-wheel)
    local_version: str = ""
    # the unparsed manifest, for facts that only one tool reads
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> WheelPin:
        return self.release.wheel

    @property
    def tag(self) -> str:
        return self.release.tag

    @property
    def releases(self) -> list[str]:
        """Every release this series serves, the primary one first."""
        return [self.base.version, *self.same_files]

    def for_release(self, version: str) -> PinManifest:
        """The same series, laid out from another release with the same files."""
        if version == self.base.version:
            return self
        return replace(self, release=self.same_files[version])

    @property
    def files(self) -> list[str]:
        return list(self.blobs)

    @property
    def steps(self) -> list[str]:
        return [BASE_STEP] + [step_of(name) for name in self.patch_hashes]

    @property
    def final_step(self) -> str:
        return self.steps[-1]

    def blobs_at(self, step: str) -> dict[str, str]:
        return {path: by_step[step] for path, by_step in self.blobs.items()}

    @classmethod
    def load(cls, path: Path) -> PinManifest:
        """Read and check pin.toml: every key a command reads is there and well formed."""
        toml = TomlFile.load(
            path,
            "pin manifest",
            "pass --patch-set with a folder under patches/ that holds pin.toml",
            "restore it with `git checkout -- patches/`, or regenerate it "
            "with scripts/export-patches",
        )
        version = toml.text(("sglang", "version"))
        patch_hashes = {
            name: toml.text(("patches", name), SHA256, "a sha256")
            for name in toml.table(("patches",))
        }
        steps = [BASE_STEP] + [step_of(name) for name in patch_hashes]
        blobs: dict[str, dict[str, str]] = {}
        for file in toml.table(("blobs",)):
            by_step = toml.table(("blobs", file))
            for step in steps:
                toml.text(("blobs", file, step), BLOB_ID, "a git blob id")
            extra = [step for step in by_step if step not in steps]
            if extra:
                raise toml.refuse(
                    ("blobs", file),
                    f"names steps {', '.join(extra)}, which are not in [patches] "
                    f"(steps: {', '.join(steps)})",
                )
            blobs[file] = {step: by_step[step] for step in steps}
        if not blobs:
            raise toml.refuse(("blobs",), "names no file")
        upstream = ("upstream-fixed",)
        return cls(
            release=ReleasePin.from_table(toml, ("sglang",), version),
            upstream_fixed=toml.wheel_pin(upstream, toml.text((*upstream, "version"))),
            patch_hashes=patch_hashes,
            blobs=blobs,
            known_releases={
                release: {
                    file: toml.text(("known-releases", release, file), BLOB_ID, "a git blob id")
                    for file in toml.table(("known-releases", release))
                }
                for release in toml.table(("known-releases",), optional=True)
            },
            same_files={
                other: ReleasePin.from_table(toml, ("same-files", other), other)
                for other in toml.table(("same-files",), optional=True)
            },
            fix_marker=toml.text((*upstream, "marker"), default=""),
            fix_function=toml.text((*upstream, "marker-function"), default=""),
            upstream_prs={
                step: toml.number((*upstream, "prs", step))
                for step in toml.table((*upstream, "prs"), optional=True)
            },
            local_version=toml.text(("build-wheel", "local"), default=""),
            raw=toml.data,
        )


def _toml_value(value: str | dict[str, str]) -> str:
    if isinstance(value, dict):
        pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
        return f"{{ {pairs} }}"
    return json.dumps(value)


def rewrite_tables(text: str, tables: dict[str, dict[str, Any]]) -> str:
    """text with the key lines of each named table replaced, the rest kept as written.

    Comments, other tables and hand-written keys stay byte for byte; a table
    that is missing is added at the end.
    """
    lines = text.splitlines()
    for name, entries in tables.items():
        body = [f"{json.dumps(key)} = {_toml_value(value)}" for key, value in entries.items()]
        header = f"[{name}]"
        if header not in lines:
            lines += ["", header, *body]
            continue
        start = lines.index(header) + 1
        end = start
        while end < len(lines) and lines[end].strip() and lines[end][0] not in "#[":
            end += 1
        lines[start:end] = body
    return "\n".join(lines) + "\n"


def require_folder(folder: Path) -> None:
    """Refuse a patch set folder that does not exist."""
    if not folder.is_dir():
        raise BackportError(
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
            raise BackportError(
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
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{self.folder / SERIES_NAME} lists {self.patch_names}, but the "
                f"manifest pins {expected}",
                "restore the patch set with `git checkout -- patches/`, or "
                "regenerate it with scripts/export-patches",
            )
        for path in self.patch_paths:
            if not path.is_file():
                raise BackportError(
                    Exit.PATCHSET_INVALID,
                    f"patch {path} is named in the series but does not exist",
                    "restore it with `git checkout -- patches/`",
                )
            actual = sha256_of(path)
            pinned = self.manifest.patch_hashes[path.name]
            if actual != pinned:
                raise BackportError(
                    Exit.PATCHSET_INVALID,
                    f"patch {path.name} has sha256 {actual}, but the manifest "
                    f"pins {pinned}: the file was changed after it was exported",
                    "restore it with `git checkout -- patches/`, or, if the change "
                    "is wanted, make it on the patched branch and run "
                    "scripts/export-patches",
                )

    def for_release(self, version: str) -> Series:
        """This series, laid out from version (the primary release or a same-files one)."""
        return replace(self, manifest=self.manifest.for_release(version))


def patch_set_folders(root: Path) -> list[Path]:
    """Every patch set folder under patches/, oldest release first."""
    folders = [p for p in root.glob("sglang-*") if (p / MANIFEST_NAME).is_file()]
    return sorted(folders, key=lambda p: release_key(p.name.removeprefix("sglang-")))


def series_for_release(root: Path, version: str) -> Series:
    """The series that serves an sglang release; refuse one no patch set serves."""
    served: dict[str, Series] = {}
    for folder in patch_set_folders(root):
        series = Series.load(folder)
        for release in series.manifest.releases:
            served[release] = series.for_release(release)
    if version in served:
        return served[version]
    fixed = min((s.manifest.upstream_fixed.version for s in served.values()), key=release_key)
    if re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", version) and release_key(version) >= release_key(
        fixed
    ):
        raise BackportError(
            Exit.ALREADY_UPSTREAM,
            f"sglang {version} already contains both fixes (they are upstream from "
            f"sglang {fixed} on): no patch is needed",
            "run that release as it is; this project serves the releases before it "
            f"({', '.join(sorted(served, key=release_key))})",
        )
    known = sorted(served, key=release_key)
    nearest = min(known, key=lambda r: _distance(r, version)) if known else "none"
    raise BackportError(
        Exit.BASE_MISMATCH,
        f"no patch set here serves sglang {version!r}; the nearest release served is "
        f"{nearest} (served: {', '.join(known)})",
        "pass --base with one of the releases served, or --patch-set DIR",
    )


def _distance(a: str, b: str) -> tuple[int, ...]:
    ka, kb = release_key(a), release_key(b)
    width = max(len(ka), len(kb))
    ka, kb = ka + (0,) * (width - len(ka)), kb + (0,) * (width - len(kb))
    return tuple(abs(x - y) for x, y in zip(ka, kb, strict=True))
