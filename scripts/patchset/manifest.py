"""The pin manifest (pin.toml) and the series file of one patch set."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import tomlread
from .errors import BackportError, Exit

# The registry's names, also where check-install and the catalog import them.
from .releases import LAUNCH_FLAGS as LAUNCH_FLAGS
from .releases import RELEASES_NAME, Fix, KnownRelease, Releases, load_releases, writer_rows
from .releases import LaunchSettings as LaunchSettings

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


# A [races] entry: (kind, buffers, rows); every buffer races in every row, kind
# being the first access and the second.
RaceEntry = tuple[str, tuple[str, ...], tuple[int, ...]]
RACE_KINDS = ("write/write", "write/read", "read/write")


@dataclass(frozen=True)
class WheelPin:
    """One released sglang wheel, named and hashed."""

    version: str
    wheel: str
    sha256: str

    @property
    def tags(self) -> tuple[str, str, str]:
        """The file name's Python, ABI and platform tags (PEP 427)."""
        python, abi, platform = self.wheel[: -len(".whl")].split("-")[2:]
        return python, abi, platform


# The Pythons sglang ships a wheel for (Requires-Python >= 3.10), as wheel tags.
PYTHONS = ("cp310", "cp311", "cp312", "cp313")
WHEELS_TABLE = "wheels"
PYTHON_TAG = re.compile(r"^cp3(?P<minor>\d+)$")


def python_key(tag: str) -> int:
    """Sort key of a CPython tag: cp39 < cp310."""
    found = PYTHON_TAG.match(tag)
    return int(found["minor"]) if found else -1


@dataclass(frozen=True)
class ReleasePin:
    """A release a patch set serves: its wheel, its git tag and what it pins."""

    wheel: WheelPin  # the default wheel (build-wheel without --python-version)
    tag: str
    torch: str = ""
    transformers: str = ""
    # CPython tag -> the release's wheel for that Python, the default one included
    wheels: dict[str, WheelPin] = field(default_factory=dict)

    @classmethod
    def from_table(cls, toml: TomlFile, keys: tuple[str, ...], version: str) -> ReleasePin:
        wheel = toml.wheel_pin(keys, version)
        return cls(
            wheel,
            toml.text((*keys, "tag")),
            toml.text((*keys, "torch"), default=""),
            toml.text((*keys, "transformers"), default=""),
            _python_wheels(toml, keys, version, wheel),
        )


def _python_wheels(
    toml: TomlFile, keys: tuple[str, ...], version: str, default: WheelPin
) -> dict[str, WheelPin]:
    """[wheels."VERSION"]: cpXY = { wheel, sha256 }, the release's wheel for each
    Python besides the default one (keys' table), each a cpXY-cpXY wheel for the
    default wheel's platform."""
    python, abi, platform = default.tags
    if python != abi or not PYTHON_TAG.match(python):
        raise toml.refuse(
            (*keys, "wheel"), f"= {json.dumps(default.wheel)} is not a CPython wheel (cpXY-cpXY)"
        )
    wheels = {python: default}
    table = (WHEELS_TABLE, version)
    for tag in toml.table(table, optional=True):
        key = (*table, tag)
        if not PYTHON_TAG.match(tag):
            raise toml.refuse(key, "is not a CPython wheel tag (cp310, cp311, ...)")
        if tag == python:
            raise toml.refuse(
                key, f"names the Python of {spell_key((*keys, 'wheel'))} again; remove it"
            )
        pin = toml.wheel_pin(key, version)
        if pin.tags != (tag, tag, platform):
            raise toml.refuse(
                (*key, "wheel"),
                f"= {json.dumps(pin.wheel)} is not a {tag}-{tag}-{platform} wheel",
            )
        wheels[tag] = pin
    return dict(sorted(wheels.items(), key=lambda item: python_key(item[0])))


_REQUIRED: Any = object()
BLOB_ID = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# PEP 427: name-version-python-abi-platform.whl (no build tag: the pins name none)
WHEEL_NAME = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)-(?P<python>[a-z]+\d+)-[^-]+-[^-]+\.whl$"
)
STEP_NAME = re.compile(r"^\d{4}$")
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
            data = tomlread.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BackportError(
                Exit.PATCHSET_INVALID, f"{what} {path} does not exist", missing
            ) from None
        except (tomlread.TOMLDecodeError, UnicodeDecodeError) as err:
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

    def names(
        self, keys: tuple[str, ...], defined: Mapping[str, object], where: str
    ) -> frozenset[str]:
        """A list of names, each one that where defines."""
        listed = self.value(keys, list)
        unknown = [
            n if isinstance(n, str) else json.dumps(n)
            for n in listed
            if not isinstance(n, str) or n not in defined
        ]
        if unknown:
            raise self.refuse(keys, f"names {', '.join(unknown)}, which {where} does not define")
        return frozenset(listed)

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


_KINDS: dict[type, str] = {
    dict: "a table",
    str: "a string",
    int: "an integer",
    list: "a list",
    bool: "a boolean",
}


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return next((name for kind, name in _KINDS.items() if isinstance(value, kind)), "a value")


@dataclass
class PinManifest:
    """What the series was made against and what each step must produce."""

    release: ReleasePin
    patch_hashes: dict[str, str]
    # path -> {step -> git blob id}, steps in series order starting with "base"
    blobs: dict[str, dict[str, str]]
    # step -> the fixes its tree holds (the base: its release's, from releases.toml)
    step_fixes: dict[str, frozenset[str]]
    # the facts every release shares (patches/releases.toml)
    registry: Releases
    # other releases whose touched files are byte-identical: the series serves them too
    same_files: dict[str, ReleasePin] = field(default_factory=dict)
    # PEP 440 local version label of the patched wheel (scripts/build-wheel)
    local_version: str = ""
    # [races]: scenario -> step -> the races left open (scripts/race-check writes it)
    races: dict[str, dict[str, tuple[RaceEntry, ...]]] = field(default_factory=dict)
    # [writers]: releases.toml's rows, with this base's added or replacing them
    # (scripts/race-check --writers)
    writers: dict[str, dict[str, str]] = field(default_factory=dict)
    # the unparsed manifest, for facts that only one tool reads
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def upstream_fixed(self) -> WheelPin:
        """The first release with the fix; scripts/review compares with it."""
        return self.registry.upstream_fixed

    @property
    def known_releases(self) -> dict[str, dict[str, str]]:
        """release -> {path -> git blob id}, oldest first, to name a base that does not match."""
        return {version: known.blobs for version, known in self.registry.known.items()}

    @property
    def _marked_fix(self) -> Fix | None:
        return next((fix for fix in self.registry.fixes.values() if fix.marker), None)

    @property
    def fix_marker(self) -> str:
        """The line the fix adds; a tree that holds it in fix_function needs no patch."""
        fix = self._marked_fix
        return fix.marker if fix else ""

    @property
    def fix_function(self) -> str:
        fix = self._marked_fix
        return fix.marker_function if fix else ""

    @property
    def upstream_prs(self) -> dict[str, int]:
        """Upstream pull request of each fix, by its name."""
        return {name: fix.pr for name, fix in self.registry.fixes.items()}

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
    def first_number(self) -> int:
        """The number of the series' first patch; for a series still empty (a new
        release), of the first step [step-fixes] plans, so that a step number names
        the same fix on every base."""
        planned = sorted(self.raw.get("step-fixes", {}))
        return int((self.steps[1:] or planned or ["1"])[0])

    @property
    def final_step(self) -> str:
        return self.steps[-1]

    def open_races(self, step: str) -> list[str]:
        """The scenarios whose [races] entry at step is not clean, in table order."""
        return [name for name, by_step in self.races.items() if by_step[step]]

    def blobs_at(self, step: str) -> dict[str, str]:
        return {path: by_step[step] for path, by_step in self.blobs.items()}

    @classmethod
    def load(cls, path: Path, registry: Releases | None = None) -> PinManifest:
        """Read and check pin.toml: every key a command reads is there and well formed.

        registry: the release facts (default: the project's patches/releases.toml).
        """
        registry = registry or load_releases()
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
        known = registry.release(version, path)
        blobs = _step_blobs(toml, known, steps, registry.path)
        if BASE_STEP in toml.table(("step-fixes",)):
            raise toml.refuse(
                ("step-fixes", BASE_STEP),
                f'is given here; the base holds what [releases."{version}"] fixes '
                f"in {registry.path} says, so remove it",
            )
        step_fixes = {BASE_STEP: known.fixes}
        for step in toml.table(("step-fixes",)):
            if not STEP_NAME.match(step):
                raise toml.refuse(("step-fixes", step), "is not a step (four digits, e.g. 0002)")
        for step in steps[1:]:
            step_fixes[step] = toml.names(
                ("step-fixes", step), registry.fixes, f"{registry.path} [fixes]"
            )
        same_files = {
            other: ReleasePin.from_table(toml, ("same-files", other), other)
            for other in toml.table(("same-files",), optional=True)
        }
        for other in same_files:
            if registry.release(other, path).blobs != known.blobs:
                raise toml.refuse(
                    ("same-files", other),
                    f'is served by this series, but [releases."{other}"] blobs in '
                    f'{registry.path} differ from [releases."{version}"] blobs; '
                    "one of them is wrong: hash both wheels (docs/maintaining.md)",
                )
        for other in toml.table((WHEELS_TABLE,), optional=True):
            if other != version and other not in same_files:
                raise toml.refuse(
                    (WHEELS_TABLE, other),
                    f"names a release this patch set does not serve (it serves "
                    f"{', '.join([version, *same_files])})",
                )
        return cls(
            release=ReleasePin.from_table(toml, ("sglang",), version),
            patch_hashes=patch_hashes,
            blobs=blobs,
            step_fixes=step_fixes,
            registry=registry,
            same_files=same_files,
            local_version=toml.text(("build-wheel", "local"), default=""),
            races=_race_tables(toml, steps),
            writers={**registry.writers, **writer_rows(toml)},
            raw=toml.data,
        )


def _step_blobs(
    toml: TomlFile, known: KnownRelease, steps: list[str], registry: Path
) -> dict[str, dict[str, str]]:
    """path -> step -> blob id: the base's from releases.toml, each patch's from [blobs]."""
    for file in toml.table(("blobs",), optional=True):
        if file not in known.blobs:
            raise toml.refuse(
                ("blobs", file),
                f'is not a file of [releases."{known.version}"] blobs in {registry}',
            )
        if BASE_STEP in toml.table(("blobs", file)):
            raise toml.refuse(
                ("blobs", file, BASE_STEP),
                f'is given here; the base is [releases."{known.version}"] blobs in '
                f"{registry}, so remove it",
            )
    blobs: dict[str, dict[str, str]] = {}
    for file, base in known.blobs.items():
        by_step = toml.table(("blobs", file), optional=True)
        for step in steps[1:]:
            toml.text(("blobs", file, step), BLOB_ID, "a git blob id")
        extra = [step for step in by_step if step not in steps]
        if extra:
            raise toml.refuse(
                ("blobs", file),
                f"names steps {', '.join(extra)}, which are not in [patches] "
                f"(steps: {', '.join(steps)})",
            )
        blobs[file] = {BASE_STEP: base, **{step: by_step[step] for step in steps[1:]}}
    return blobs


def _race_tables(toml: TomlFile, steps: list[str]) -> dict[str, dict[str, tuple[RaceEntry, ...]]]:
    """[races]: every scenario lists every step; each entry is {kind, buffers, rows}."""
    races: dict[str, dict[str, tuple[RaceEntry, ...]]] = {}
    for scenario in toml.table(("races",), optional=True):
        toml.table(("races", scenario))
        races[scenario] = {}
        for step in steps:
            keys = ("races", scenario, step)
            entries = []
            for n, entry in enumerate(toml.value(keys, list)):
                if not isinstance(entry, dict):
                    raise toml.refuse(keys, f"entry {n + 1} is {_kind(entry)}, not a table")
                kind = entry.get("kind")
                buffers, rows = entry.get("buffers"), entry.get("rows")
                if (
                    kind not in RACE_KINDS
                    or not isinstance(buffers, list)
                    or not all(isinstance(b, str) for b in buffers)
                    or not isinstance(rows, list)
                    or not all(isinstance(r, int) and not isinstance(r, bool) for r in rows)
                ):
                    raise toml.refuse(
                        keys,
                        f"entry {n + 1} is not {{ kind = one of {', '.join(RACE_KINDS)}, "
                        "rows = [integers], buffers = [strings] }",
                    )
                entries.append((kind, tuple(buffers), tuple(rows)))
            races[scenario][step] = tuple(entries)
    return races


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
    return replace_tables(
        text,
        {
            name: [f"{json.dumps(key)} = {_toml_value(value)}" for key, value in entries.items()]
            for name, entries in tables.items()
        },
    )


def replace_tables(text: str, tables: dict[str, list[str]]) -> str:
    """text with the key lines of each table [NAME] replaced by the lines given."""
    lines = text.splitlines()
    for name, body in tables.items():
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
    def load(cls, folder: Path, registry: Releases | None = None) -> Series:
        """Read the series and its manifest without checking patch hashes.

        registry: the release facts (default: the project's patches/releases.toml).
        """
        require_folder(folder)
        manifest = PinManifest.load(folder / MANIFEST_NAME, registry)
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
    if not root.is_dir():
        return []
    # iterdir, not glob: the zipapp reads patches/ through zipfile.Path
    folders = [
        p for p in root.iterdir() if p.name.startswith("sglang-") and (p / MANIFEST_NAME).is_file()
    ]
    return sorted(folders, key=lambda p: release_key(p.name.removeprefix("sglang-")))


def series_for_release(root: Path, version: str) -> Series:
    """The series that serves an sglang release; refuse one no patch set serves."""
    served: dict[str, Series] = {}
    registry = load_releases(root / RELEASES_NAME)
    for folder in patch_set_folders(root):
        series = Series.load(folder, registry)
        for release in series.manifest.releases:
            served[release] = series.for_release(release)
    if version in served:
        return served[version]
    fixed = registry.upstream_fixed.version
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
