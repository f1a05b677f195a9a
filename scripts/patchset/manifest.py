"""The pin manifest (pin.toml) and the series file of one patch set."""

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import Any

from .errors import BackportError, Exit
from .releases import (
    BLOB_ID,
    RELEASES_NAME,
    SHA256,
    KnownRelease,
    Releases,
    TomlFile,
    WheelPin,
    kind_of,
    load_releases,
    release_key,
    spell_key,
    writer_rows,
)

MANIFEST_NAME = "pin.toml"
SERIES_NAME = "series"
BASE_STEP = "base"
STEP_NAME = re.compile(r"^\d{4}$")
RESTORE = "restore it with `git checkout -- patches/`"
REGENERATE = "regenerate it with scripts/export-patches"
REPAIR = f"{RESTORE}, or {REGENERATE}"
ON_BRANCH = "make it on the patched branch and run scripts/export-patches"
# A [races] entry: (kind: first access/second, buffers, rows); every buffer races in every row.
RaceEntry = tuple[str, tuple[str, ...], tuple[int, ...]]
RACE_KINDS = ("write/write", "write/read", "read/write")
# The Pythons sglang ships a wheel for (Requires-Python >= 3.10), as wheel tags.
PYTHONS = ("cp310", "cp311", "cp312", "cp313")
WHEELS_TABLE = "wheels"
PYTHON_TAG = re.compile(r"^cp3(?P<minor>\d+)$")


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def git_blob_id(data: bytes) -> str:  # as `git hash-object` gives it
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def step_of(patch_name: str) -> str:  # the step a patch brings the tree to: '0001'-...
    return patch_name.split("-", 1)[0]


@dataclass(frozen=True)
class ReleasePin:
    """A release a patch set serves: its wheel, its git tag and what it pins."""

    wheel: WheelPin  # the default wheel (build-wheel without --python-version)
    tag: str
    torch: str = ""
    transformers: str = ""
    wheels: dict[str, WheelPin] = field(default_factory=dict)  # by CPython tag, default included

    @classmethod
    def from_table(cls, toml: TomlFile, keys: tuple[str, ...], version: str) -> "ReleasePin":
        """keys' table, and [wheels."VERSION"]: a cpXY-cpXY wheel per other Python, one platform."""
        default = toml.wheel_pin(keys, version)
        python, abi, platform = default.tags
        if python != abi or not PYTHON_TAG.match(python):
            problem = f"= {json.dumps(default.wheel)} is not a CPython wheel (cpXY-cpXY)"
            raise toml.refuse((*keys, "wheel"), problem)
        wheels = {python: default}
        for cp in toml.table((WHEELS_TABLE, version), optional=True):
            key = (WHEELS_TABLE, version, cp)
            if not PYTHON_TAG.match(cp):
                raise toml.refuse(key, "is not a CPython wheel tag (cp310, cp311, ...)")
            if cp == python:
                problem = f"names the Python of {spell_key((*keys, 'wheel'))} again; remove it"
                raise toml.refuse(key, problem)
            if (pin := toml.wheel_pin(key, version)).tags != (cp, cp, platform):
                problem = f"= {json.dumps(pin.wheel)} is not a {cp}-{cp}-{platform} wheel"
                raise toml.refuse((*key, "wheel"), problem)
            wheels[cp] = pin
        pins = [toml.text((*keys, key), default="") for key in ("torch", "transformers")]
        by_minor = dict(sorted(wheels.items(), key=lambda item: int(item[0][3:])))
        return cls(default, toml.text((*keys, "tag")), *pins, by_minor)


@dataclass
class PinManifest:
    """What the series was made against and what each step must produce."""

    release: ReleasePin
    patch_hashes: dict[str, str]
    blobs: dict[str, dict[str, str]]  # path -> step -> git blob id, "base" first
    step_fixes: dict[str, frozenset[str]]  # step -> the fixes its tree holds
    registry: Releases
    # other releases whose touched files are byte-identical: the series serves them too
    same_files: dict[str, ReleasePin] = field(default_factory=dict)
    local_version: str = ""  # the patched wheel's PEP 440 local label
    # [races]: scenario -> step -> the races left open (scripts/race-check writes it)
    races: dict[str, dict[str, tuple[RaceEntry, ...]]] = field(default_factory=dict)
    # releases.toml's [writers] rows, with this base's added or replacing them
    writers: dict[str, dict[str, str]] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)  # for facts only one tool reads

    @property
    def base(self) -> WheelPin:
        return self.release.wheel

    @property
    def releases(self) -> list[str]:
        """Every release this series serves, the primary one first."""
        return [self.base.version, *self.same_files]

    def for_release(self, version: str) -> "PinManifest":
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
        """The first patch's number (or [step-fixes]'): a step number names one fix on all bases."""
        return int((self.steps[1:] or sorted(self.raw.get("step-fixes", {})) or ["1"])[0])

    @property
    def final_step(self) -> str:
        return self.steps[-1]

    def blobs_at(self, step: str) -> dict[str, str]:
        return {path: by_step[step] for path, by_step in self.blobs.items()}

    @classmethod
    def load(cls, path: Path, registry: Releases | None = None) -> "PinManifest":
        """pin.toml, checked: every key a command reads is there and well formed."""
        registry = registry or load_releases()
        missing = "pass --patch-set with a folder under patches/ that holds pin.toml"
        toml = TomlFile.load(path, "pin manifest", missing, REPAIR)
        version = toml.text(("sglang", "version"))
        patch_hashes = {n: toml.text(("patches", n), SHA256) for n in toml.table(("patches",))}
        steps = [BASE_STEP] + [step_of(name) for name in patch_hashes]
        known = registry.release(version, path)
        for step in toml.table(("step-fixes",)):
            if step == BASE_STEP:
                holds = f'the base holds what [releases."{version}"] fixes in {registry.path} says'
                raise toml.refuse(("step-fixes", step), f"is given here; {holds}, so remove it")
            if not STEP_NAME.match(step):
                raise toml.refuse(("step-fixes", step), "is not a step (four digits, e.g. 0002)")
        where = f"{registry.path} [fixes]"
        step_fixes = {BASE_STEP: known.fixes}
        step_fixes |= {s: toml.names(("step-fixes", s), registry.fixes, where) for s in steps[1:]}
        same_files: dict[str, ReleasePin] = {}
        for other in toml.table(("same-files",), optional=True):
            same_files[other] = ReleasePin.from_table(toml, ("same-files", other), other)
            if registry.release(other, path).blobs != known.blobs:
                raise toml.refuse(
                    ("same-files", other),
                    f'is served by this series, but [releases."{other}"] blobs in '
                    f'{registry.path} differ from [releases."{version}"] blobs; '
                    "one of them is wrong: hash both wheels (docs/maintaining.md)",
                )
        served = ", ".join([version, *same_files])
        for other in toml.table((WHEELS_TABLE,), optional=True):
            if other != version and other not in same_files:
                problem = f"names a release this patch set does not serve (it serves {served})"
                raise toml.refuse((WHEELS_TABLE, other), problem)
        return cls(
            release=ReleasePin.from_table(toml, ("sglang",), version),
            patch_hashes=patch_hashes,
            blobs=_step_blobs(toml, known, steps, registry.path),
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
    release = f'[releases."{known.version}"] blobs in {registry}'
    for file in toml.table(("blobs",), optional=True):
        if file not in known.blobs:
            raise toml.refuse(("blobs", file), f"is not a file of {release}")
        if BASE_STEP in toml.table(("blobs", file)):
            problem = f"is given here; the base is {release}, so remove it"
            raise toml.refuse(("blobs", file, BASE_STEP), problem)
        if extra := [step for step in toml.table(("blobs", file)) if step not in steps]:
            raise toml.refuse(
                ("blobs", file),
                f"names steps {', '.join(extra)}, which are not in [patches] "
                f"(steps: {', '.join(steps)})",
            )
    return {
        file: {BASE_STEP: base}
        | {step: toml.text(("blobs", file, step), BLOB_ID) for step in steps[1:]}
        for file, base in known.blobs.items()
    }


def _is_list(value: object, kind: type) -> bool:
    return isinstance(value, list) and all(type(item) is kind for item in value)


def _race_tables(toml: TomlFile, steps: list[str]) -> dict[str, dict[str, tuple[RaceEntry, ...]]]:
    """[races]: every scenario lists every step; each entry is {kind, buffers, rows}."""
    form = f"{{ kind = one of {', '.join(RACE_KINDS)}, rows = [integers], buffers = [strings] }}"
    races: dict[str, dict[str, tuple[RaceEntry, ...]]] = {}
    for scenario in toml.table(("races",), optional=True):
        toml.table(("races", scenario))
        races[scenario] = {}
        for step in steps:
            keys = ("races", scenario, step)
            entries = toml.value(keys, list)
            for n, entry in enumerate(entries, 1):
                if not isinstance(entry, dict):
                    raise toml.refuse(keys, f"entry {n} is {kind_of(entry)}, not a table")
                if entry.get("kind") not in RACE_KINDS or not (
                    _is_list(entry.get("buffers"), str) and _is_list(entry.get("rows"), int)
                ):
                    raise toml.refuse(keys, f"entry {n} is not {form}")
            races[scenario][step] = tuple(
                (e["kind"], tuple(e["buffers"]), tuple(e["rows"])) for e in entries
            )
    return races


def rewrite_tables(text: str, tables: dict[str, dict[str, Any]]) -> str:
    """text with each named table's key lines written from its strings or inline tables."""

    def pair(key: str, value: str | dict[str, str]) -> str:
        inline = isinstance(value, dict) and ", ".join(pair(*item) for item in value.items())
        return f"{json.dumps(key)} = {f'{{ {inline} }}' if inline else json.dumps(value)}"

    lines = {name: [pair(*item) for item in rows.items()] for name, rows in tables.items()}
    return replace_tables(text, lines)


def replace_tables(text: str, tables: dict[str, list[str]]) -> str:
    """text with the key lines of each table [NAME] replaced by the lines given; comments,
    other tables and hand-written keys stay byte for byte, a missing table is appended."""
    lines = text.splitlines()
    for name, body in tables.items():
        header = f"[{name}]"
        if header not in lines:
            lines += ["", header, *body]
            continue
        start = end = lines.index(header) + 1
        while end < len(lines) and lines[end].strip() and lines[end][0] not in "#[":
            end += 1
        lines[start:end] = body
    return "\n".join(lines) + "\n"


def _invalid(problem: str, next_step: str) -> BackportError:
    return BackportError(Exit.PATCHSET_INVALID, problem, next_step)


def require_folder(folder: Path) -> None:
    if not folder.is_dir():
        problem = f"patch set folder {folder} does not exist"
        raise _invalid(problem, "pass --patch-set with a folder under patches/")


@dataclass(frozen=True)
class Series:
    folder: Path
    patch_names: list[str]
    manifest: PinManifest

    @property
    def patch_paths(self) -> list[Path]:
        return [self.folder / name for name in self.patch_names]

    @classmethod
    def load(cls, folder: Path, registry: Releases | None = None) -> "Series":
        """The series and its manifest (registry: as PinManifest.load's), hashes unchecked."""
        require_folder(folder)
        manifest = PinManifest.load(folder / MANIFEST_NAME, registry)
        if not (series_file := folder / SERIES_NAME).is_file():
            raise _invalid(f"{series_file} does not exist", REGENERATE)
        return cls(folder, [name for name, _ in series_entries(series_file)], manifest)

    def verify(self) -> None:
        """Refuse a series whose patch files differ from the manifest's hashes."""
        if self.patch_names != (expected := list(self.manifest.patch_hashes)):
            problem = f"{self.folder / SERIES_NAME} lists {self.patch_names}, but the manifest "
            raise _invalid(f"{problem}pins {expected}", REPAIR)
        for path in self.patch_paths:
            if not path.is_file():
                raise _invalid(f"patch {path} is named in the series but does not exist", RESTORE)
            actual, pinned = sha256_of(path), self.manifest.patch_hashes[path.name]
            if actual != pinned:
                raise _invalid(
                    f"patch {path.name} has sha256 {actual}, but the manifest pins {pinned}: "
                    "the file was changed after it was exported",
                    f"{RESTORE}, or, if the change is wanted, {ON_BRANCH}",
                )

    def for_release(self, version: str) -> "Series":
        return replace(self, manifest=self.manifest.for_release(version))


def series_entries(path: Path) -> list[tuple[str, int]]:
    """A series file's (patch name, line number) entries: no blank or comment line."""
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    return [(line.strip(), n) for n, line in lines if line.strip()[:1] not in ("", "#")]


def patch_set_folders(root: Path) -> list[Path]:
    # iterdir, not glob: the zipapp reads patches/ through zipfile.Path
    found = root.iterdir() if root.is_dir() else []
    folders = [p for p in found if p.name.startswith("sglang-") and (p / MANIFEST_NAME).is_file()]
    return sorted(folders, key=lambda p: release_key(p.name.removeprefix("sglang-")))


def series_for_release(root: Path, version: str) -> Series:
    """The series that serves an sglang release; refuse one no patch set serves."""
    registry = load_releases(root / RELEASES_NAME)
    all_series = [Series.load(folder, registry) for folder in patch_set_folders(root)]
    served = {r: series.for_release(r) for series in all_series for r in series.manifest.releases}
    if version in served:
        return served[version]
    known = sorted(served, key=release_key)
    fixed = registry.upstream_fixed.version
    is_release = re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", version)
    if is_release and release_key(version) >= release_key(fixed):
        raise BackportError(
            Exit.ALREADY_UPSTREAM,
            f"sglang {version} already contains both fixes (they are upstream from "
            f"sglang {fixed} on): no patch is needed",
            "run that release as it is; this project serves the releases before it "
            f"({', '.join(known)})",
        )
    wanted = release_key(version)
    nearest = min(
        known,
        key=lambda r: [abs(x - y) for x, y in zip_longest(release_key(r), wanted, fillvalue=0)],
        default="none",
    )
    raise BackportError(
        Exit.BASE_MISMATCH,
        f"no patch set here serves sglang {version!r}; the nearest release served is "
        f"{nearest} (served: {', '.join(known)})",
        "pass --base with one of the releases served, or --patch-set DIR",
    )
