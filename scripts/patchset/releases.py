"""patches/releases.toml: the facts every sglang release shares, read and checked once;
and TomlFile, the checked reader of every data file under patches/."""

import functools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import tomlread
from .errors import BackportError, Exit
from .paths import PATCHES_ROOT

RELEASES_NAME = "releases.toml"
RESTORE_RELEASES = "restore it with `git checkout -- patches/releases.toml`"
ADDING = "(docs/maintaining.md: adding a release)"
REPAIR_RELEASES = f"{RESTORE_RELEASES}, or fix it as the comment at its top describes {ADDING}"
Form = tuple[re.Pattern[str], str]  # a text's pattern, and what such a text is called
BLOB_ID: Form = (re.compile(r"^[0-9a-f]{40}$"), "a git blob id")
SHA256: Form = (re.compile(r"^[0-9a-f]{64}$"), "a sha256")
# PEP 427: name-version-python-abi-platform.whl (no build tag: the pins name none)
WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.]+-[^-]+-[a-z]+\d+-[^-]+-[^-]+\.whl$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_REQUIRED: Any = object()
# bool before int: a bool is an int too
_KINDS = {bool: "a boolean", dict: "a table", str: "a string", int: "an integer", list: "a list"}


def release_key(release: str) -> tuple[int, ...]:
    """Sort key for sglang release names: 0.5.13 < 0.5.13.post1 < 0.5.14."""
    return tuple(int(part) for part in re.findall(r"\d+", release))


def spell_key(keys: tuple[str, ...]) -> str:
    """A key path as TOML writes it: blobs."python/sglang/x.py".0002."""
    return ".".join(k if _BARE_KEY.match(k) else json.dumps(k) for k in keys)


def kind_of(value: object) -> str:
    return next((name for kind, name in _KINDS.items() if isinstance(value, kind)), "a value")


@dataclass(frozen=True)
class WheelPin:
    version: str
    wheel: str
    sha256: str

    @property
    def tags(self) -> tuple[str, str, str]:
        """The file name's Python, ABI and platform tags (PEP 427)."""
        python, abi, platform = self.wheel.removesuffix(".whl").split("-")[2:]
        return python, abi, platform


@dataclass(frozen=True)
class TomlFile:
    """A TOML file read by key path: a missing or wrong value is refused with key and file."""

    path: Path
    data: dict[str, Any]
    repair: str  # the next step for a damaged file

    @classmethod
    def load(cls, path: Path, what: str, missing: str, repair: str) -> "TomlFile":
        try:
            data = tomlread.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            problem, next_step = f"{what} {path} does not exist", missing
        except (tomlread.TOMLDecodeError, UnicodeDecodeError, RecursionError) as err:
            why = "nested too deeply" if isinstance(err, RecursionError) else err
            problem, next_step = f"{what} {path} is not valid TOML: {why}", repair
        else:
            return cls(path, data, repair)
        raise BackportError(Exit.PATCHSET_INVALID, problem, next_step)

    def refuse(self, keys: tuple[str, ...], problem: str) -> BackportError:
        return BackportError(
            Exit.PATCHSET_INVALID, f"{self.path}: {spell_key(keys)} {problem}", self.repair
        )

    def value(self, keys: tuple[str, ...], kind: type, default: Any = _REQUIRED) -> Any:
        node: Any = self.data
        for depth, key in enumerate(keys):
            if not isinstance(node, dict):
                raise self.refuse(keys[:depth], f"is {kind_of(node)}, not a table")
            if key not in node:
                if default is not _REQUIRED:
                    return default
                raise self.refuse(keys[: depth + 1], "is missing")
            node = node[key]
        if not isinstance(node, kind) or isinstance(node, bool) is not (kind is bool):
            raise self.refuse(keys, f"is {kind_of(node)}, not {_KINDS[kind]}")
        return node

    def table(self, keys: tuple[str, ...], optional: bool = False) -> dict[str, Any]:
        return dict(self.value(keys, dict, {} if optional else _REQUIRED))

    def text(
        self, keys: tuple[str, ...], form: Form | None = None, default: Any = _REQUIRED
    ) -> str:
        text = self.value(keys, str, default)
        if form is not None and not form[0].match(text):
            raise self.refuse(keys, f"= {json.dumps(text)} is not {form[1]}")
        return str(text)

    def names(self, keys: tuple[str, ...], defined: dict[str, Any], where: str) -> frozenset[str]:
        listed = self.value(keys, list)
        if unknown := [n for n in listed if not isinstance(n, str) or n not in defined]:
            names = ", ".join(n if isinstance(n, str) else json.dumps(n) for n in unknown)
            raise self.refuse(keys, f"names {names}, which {where} does not define")
        return frozenset(listed)

    def wheel_pin(self, keys: tuple[str, ...], version: str) -> WheelPin:
        """The table's wheel (a wheel file name of that sglang version) and sha256."""
        wheel = self.text((*keys, "wheel"), (WHEEL_NAME, "a wheel file name (PEP 427)"))
        if wheel.split("-")[:2] != ["sglang", version]:  # WHEEL_NAME: neither holds a "-"
            problem = f"= {json.dumps(wheel)} is not a wheel of sglang {version}"
            raise self.refuse((*keys, "wheel"), problem)
        return WheelPin(version, wheel, self.text((*keys, "sha256"), SHA256))


@dataclass(frozen=True)
class Fix:
    """An upstream fix of the race, by the name releases and steps use (fix-a, fix-b)."""

    name: str
    pr: int
    about: str
    marker: str = ""  # a line the fix adds; in marker_function it means "fixed"
    marker_function: str = ""

    @property
    def ref(self) -> str:
        """The upstream pull request, as the patches' trailers and the catalog name it."""
        return f"sgl-project/sglang#{self.pr}"


@dataclass(frozen=True)
class KnownRelease:
    """An sglang release as shipped: the fixes it carries and its files' blob ids."""

    version: str
    fixes: frozenset[str]
    blobs: dict[str, str]  # path -> git blob id
    wheel: WheelPin | None = None


# [launch.PROFILE], named by a release's `launch`: the settings check-install's verdict reads,
# by ServerArgs field; a store_true flag's default is false, a value flag's a string or None.
LAUNCH_TABLE = "launch"
LAUNCH_FLAGS = {
    "disaggregation_mode": str,
    "disable_overlap_schedule": bool,
    "speculative_algorithm": str,
    "device": str,
    "enable_hisparse": bool,
    "disable_cuda_graph": bool,
}
LAUNCH_OPTIONAL = {"disable_decode_cuda_graph": bool}
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class LaunchFlag:
    """One launch setting as a release's ServerArgs spells it."""

    field: str  # the ServerArgs field (argparse dest)
    flag: str  # e.g. --disaggregation-mode
    default: str | bool | None


@dataclass(frozen=True)
class LaunchSettings:
    """What decides whether a deployment reaches the race, where ServerArgs cannot be imported."""

    release: str
    flags: dict[str, LaunchFlag]  # by field
    eagle_family: frozenset[str]  # --speculative-algorithm values that run the EAGLE path
    war_barrier_env: bool  # SGLANG_ENABLE_WAR_BARRIER turns the barrier on off CUDA
    war_fast_path: bool  # the barrier waits on a read-done event after a graph replay
    profile: str = ""  # the [launch.PROFILE] the release names


def _launch_profile(toml: TomlFile, name: str) -> LaunchSettings:
    """[launch.NAME], checked; its release is filled in by each release that names it."""
    keys = (LAUNCH_TABLE, name)
    flags = {}
    for field_name, kind in {**LAUNCH_FLAGS, **LAUNCH_OPTIONAL}.items():
        key = field_name.replace("_", "-")
        if field_name in LAUNCH_OPTIONAL and key not in toml.table(keys):
            continue
        flag = toml.text((*keys, key, "flag"), (_FLAG, "a long option (--name)"))
        default = toml.value((*keys, key, "default"), kind, None if kind is str else False)
        if kind is bool and default is not False:
            raise toml.refuse((*keys, key, "default"), "of a store_true flag must be false")
        flags[field_name] = LaunchFlag(field_name, flag, default)
    eagle = toml.value((*keys, "eagle-family"), list)
    if not eagle or not all(isinstance(item, str) for item in eagle):
        raise toml.refuse((*keys, "eagle-family"), "is not a list of strings")
    war_env, war_fast = (toml.value((*keys, k), bool) for k in ("war-barrier-env", "war-fast-path"))
    return LaunchSettings("", flags, frozenset(eagle), war_env, war_fast, name)


# [writers] rows: "FILE FUNCTION WHAT" = { stream, order, scenarios | reason }.
WRITERS_TABLE = "writers"
WRITER_FIELDS = ("stream", "order", "scenarios", "reason")


def writer_rows(toml: TomlFile) -> dict[str, dict[str, str]]:
    """The [writers] rows, fields checked (race-check --writers checks their scenarios)."""
    rows: dict[str, dict[str, str]] = {}
    for key in toml.table((WRITERS_TABLE,), optional=True):
        keys = (WRITERS_TABLE, key)
        if unknown := [name for name in toml.table(keys) if name not in WRITER_FIELDS]:
            raise toml.refuse(
                keys, f"has {', '.join(unknown)}; a row has only {', '.join(WRITER_FIELDS)}"
            )
        row = {name: toml.text((*keys, name)) for name in WRITER_FIELDS[:2]}
        row |= {name: toml.text((*keys, name), default="") for name in WRITER_FIELDS[2:]}
        if not (row["scenarios"] or row["reason"]):
            raise toml.refuse(keys, "needs scenarios (what plays it) or a reason (why none does)")
        rows[key] = {name: text for name, text in row.items() if text}
    return rows


@dataclass(frozen=True)
class Releases:
    """patches/releases.toml: the facts every release shares (see its header)."""

    path: Path
    fixes: dict[str, Fix]
    known: dict[str, KnownRelease]  # oldest first
    upstream_fixed: WheelPin
    launch: dict[str, LaunchSettings] = field(default_factory=dict)  # by release
    # the FutureMap writers every release has; a pin.toml adds its own
    writers: dict[str, dict[str, str]] = field(default_factory=dict)

    def release(self, version: str, needed_by: Path) -> KnownRelease:
        if version not in self.known:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f'{self.path} has no [releases."{version}"], the release {needed_by} serves',
                f'add [releases."{version}"] to {self.path} {ADDING}',
            )
        return self.known[version]


@functools.cache
def load_releases(path: Path = PATCHES_ROOT / RELEASES_NAME) -> Releases:
    toml = TomlFile.load(path, "release registry", RESTORE_RELEASES, REPAIR_RELEASES)
    fixes: dict[str, Fix] = {}
    for name in toml.table(("fixes",)):
        keys = ("fixes", name)
        pr, about = toml.value((*keys, "pr"), int), toml.text((*keys, "about"))
        optional = (toml.text((*keys, k), default="") for k in ("marker", "marker-function"))
        fixes[name] = Fix(name, pr, about, *optional)
    profiles = {n: _launch_profile(toml, n) for n in toml.table((LAUNCH_TABLE,), optional=True)}
    known: dict[str, KnownRelease] = {}
    launch: dict[str, LaunchSettings] = {}
    for version in sorted(toml.table(("releases",)), key=release_key):
        keys = ("releases", version)
        fixed = toml.names((*keys, "fixes"), fixes, "[fixes]")
        blobs = {f: toml.text((*keys, "blobs", f), BLOB_ID) for f in toml.table((*keys, "blobs"))}
        wheel = toml.wheel_pin(keys, version) if "wheel" in toml.table(keys) else None
        known[version] = KnownRelease(version, fixed, blobs, wheel)
        profile = toml.text((*keys, LAUNCH_TABLE), default="")
        if profile and profile not in profiles:
            raise toml.refuse(
                (*keys, LAUNCH_TABLE),
                f"= {json.dumps(profile)} names no [{LAUNCH_TABLE}.{profile}] "
                f"(profiles: {', '.join(profiles) or 'none'})",
            )
        if profile:
            launch[version] = replace(profiles[profile], release=version)
    first = toml.text(("upstream-fixed",))
    if first not in known:
        raise toml.refuse(("upstream-fixed",), f'= "{first}" has no [releases."{first}"]')
    upstream = known[first].wheel or toml.wheel_pin(("releases", first), first)
    return Releases(path, fixes, known, upstream, launch, writer_rows(toml))
