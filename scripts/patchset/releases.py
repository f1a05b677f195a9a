"""patches/releases.toml: the facts every sglang release shares, read and checked once."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BackportError, Exit
from .paths import PATCHES_ROOT

if TYPE_CHECKING:
    from .manifest import TomlFile, WheelPin

RELEASES_NAME = "releases.toml"
REPAIR_RELEASES = (
    "restore it with `git checkout -- patches/releases.toml`, or fix it as the comment "
    "at its top describes (docs/maintaining.md: adding a release)"
)


@dataclass(frozen=True)
class Fix:
    """An upstream fix of the race, by the name releases and steps use (fix-a, fix-b)."""

    name: str
    pr: int
    about: str
    marker: str = ""  # a line the fix adds; in marker_function it means "fixed"
    marker_function: str = ""


@dataclass(frozen=True)
class KnownRelease:
    """An sglang release as shipped: the fixes it carries and its files' blob ids."""

    version: str
    fixes: frozenset[str]
    blobs: dict[str, str]  # path -> git blob id
    wheel: WheelPin | None = None


# [launch.PROFILE]: the launch settings check-install's verdict reads, by
# ServerArgs field; a store_true flag's default is false, a value flag's is a
# string or absent (None). A release names its profile with `launch`.
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
    """A release's launch profile: the settings that decide whether a deployment
    reaches the race, for when that release's own ServerArgs cannot be imported
    (check-install)."""

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
        flag = toml.text((*keys, key, "flag"), _FLAG, "a long option (--name)")
        default = toml.value((*keys, key, "default"), kind, None if kind is str else False)
        if kind is bool and default is not False:
            raise toml.refuse((*keys, key, "default"), "of a store_true flag must be false")
        flags[field_name] = LaunchFlag(field_name, flag, default)
    eagle = toml.value((*keys, "eagle-family"), list)
    if not eagle or not all(isinstance(item, str) for item in eagle):
        raise toml.refuse((*keys, "eagle-family"), "is not a list of strings")
    return LaunchSettings(
        "",
        flags,
        frozenset(eagle),
        bool(toml.value((*keys, "war-barrier-env"), bool)),
        bool(toml.value((*keys, "war-fast-path"), bool)),
        name,
    )


# [writers] rows: "FILE FUNCTION WHAT" = { stream, order, scenarios | reason }.
WRITERS_TABLE = "writers"
WRITER_FIELDS = ("stream", "order", "scenarios", "reason")


def writer_rows(toml: TomlFile) -> dict[str, dict[str, str]]:
    """The file's [writers] rows, each checked for its fields (race-check --writers
    checks the scenario names against its catalogue)."""
    rows: dict[str, dict[str, str]] = {}
    for key in toml.table((WRITERS_TABLE,), optional=True):
        keys = (WRITERS_TABLE, key)
        unknown = [name for name in toml.table(keys) if name not in WRITER_FIELDS]
        if unknown:
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

    @classmethod
    def load(cls, path: Path) -> Releases:
        # manifest.py re-exports this module's names, so its reader comes in here
        from .manifest import BLOB_ID, TomlFile, release_key

        toml = TomlFile.load(
            path,
            "release registry",
            "restore it with `git checkout -- patches/releases.toml`",
            REPAIR_RELEASES,
        )
        fixes = {
            name: Fix(
                name,
                toml.number(("fixes", name, "pr")),
                toml.text(("fixes", name, "about")),
                toml.text(("fixes", name, "marker"), default=""),
                toml.text(("fixes", name, "marker-function"), default=""),
            )
            for name in toml.table(("fixes",))
        }
        profiles = {
            name: _launch_profile(toml, name) for name in toml.table((LAUNCH_TABLE,), optional=True)
        }
        known: dict[str, KnownRelease] = {}
        launch: dict[str, LaunchSettings] = {}
        for version in sorted(toml.table(("releases",)), key=release_key):
            keys = ("releases", version)
            known[version] = KnownRelease(
                version,
                toml.names((*keys, "fixes"), fixes, "[fixes]"),
                {
                    file: toml.text((*keys, "blobs", file), BLOB_ID, "a git blob id")
                    for file in toml.table((*keys, "blobs"))
                },
                toml.wheel_pin(keys, version) if "wheel" in toml.table(keys) else None,
            )
            profile = toml.text((*keys, LAUNCH_TABLE), default="")
            if profile and profile not in profiles:
                raise toml.refuse(
                    (*keys, LAUNCH_TABLE),
                    f"= {json.dumps(profile)} names no [{LAUNCH_TABLE}.{profile}] "
                    f"(profiles: {', '.join(profiles) or 'none'})",
                )
            if profile:
                launch[version] = replace(profiles[profile], release=version)
        fixed = toml.text(("upstream-fixed",))
        if fixed not in known:
            raise toml.refuse(("upstream-fixed",), f'= "{fixed}" has no [releases."{fixed}"]')
        upstream = known[fixed].wheel or toml.wheel_pin(("releases", fixed), fixed)
        return cls(path, fixes, known, upstream, launch, writer_rows(toml))

    def release(self, version: str, needed_by: Path) -> KnownRelease:
        """A known release; refuse one the registry does not have."""
        if version not in self.known:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f'{self.path} has no [releases."{version}"], the release {needed_by} serves',
                f'add [releases."{version}"] to {self.path} (docs/maintaining.md: '
                "adding a release)",
            )
        return self.known[version]


@functools.cache
def load_releases(path: Path = PATCHES_ROOT / RELEASES_NAME) -> Releases:
    """The release registry, read once per process."""
    return Releases.load(path)
