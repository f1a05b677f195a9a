"""A damaged pin.toml or releases.toml is exit 6 with the key and the file, in every command.

Each case damages the default patch set's pin.toml, or patches/releases.toml,
in a scratch copy of the project (scripts/ and patches/), so that every
command, check-install too (it reads every manifest under patches/), meets
the damage the way a user's clone would. Each command must refuse before it
does anything else: no traceback, no KeyError, one line that names the key
and the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from command_server import CommandServer
from patchset import paths
from patchset.errors import Exit

DECODE = "python/sglang/srt/disaggregation/decode.py"

PIN = f"sglang-{paths.DEFAULT_BASE}/pin.toml"
RELEASES = "releases.toml"

# name -> (old text of pin.toml, new text, the key the refusal must name)
DAMAGE = {
    "a [blobs] step missing": (
        '"0001" = "2164cade4909b0712654791f05d35dfe137796db", ',
        "",
        f'blobs."{DECODE}".0001 is missing',
    ),
    "a required table missing": (
        "[sglang]\n",
        "[sglang-typo]\n",
        "sglang is missing",
    ),
    "a required field missing": ('tag = "v0.5.15.post1"\n', "", "sglang.tag is missing"),
    # deeper than a TOML reader's recursion goes (tomllib's, and 3.10's subset reader)
    "a value nested too deeply": (
        'tag = "v0.5.15.post1"\n',
        'tag = "v0.5.15.post1"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n",
        "is not valid TOML: nested too deeply",
    ),
    "a wheel that is not a wheel file name": (
        'wheel = "sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl"',
        'wheel = "sglang-0.5.15.post1.zip"',
        'sglang.wheel = "sglang-0.5.15.post1.zip" is not a wheel file name',
    ),
    "a wheel of another release": (
        'wheel = "sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl"',
        'wheel = "sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl"',
        "is not a wheel of sglang 0.5.15.post1",
    ),
    "a blob id that is not one": (
        '"0002" = "390495b8d4916143dade4d8a4e41748d8d77a6c7"',
        '"0002" = "390495b8"',
        f'blobs."{DECODE}".0002 = "390495b8" is not a git blob id',
    ),
}
# the same for patches/releases.toml
REGISTRY_DAMAGE = {
    "a release's blobs missing": (
        'fixes = ["fix-a"]\nlaunch = "read-done-barrier"\nblobs = {',
        'fixes = ["fix-a"]\nlaunch = "read-done-barrier"\nblob = {',
        'releases."0.5.16".blobs is missing',
    ),
    "a fix that is not defined": (
        'fixes = ["fix-b"]\nwheel',
        'fixes = ["fix-c"]\nwheel',
        'releases."0.5.19".fixes names fix-c, which [fixes] does not define',
    ),
    "a launch profile that is not there": (
        'launch = "read-done-barrier"\n',
        'launch = "read-done-barier"\n',
        'releases."0.5.14".launch = "read-done-barier" names no [launch.read-done-barier]',
    ),
    "the base not there": (
        '[releases."0.5.15.post1"]',
        '[releases."0.5.15.post9"]',
        'has no [releases."0.5.15.post1"], the release',
    ),
}
FILE = {**{name: PIN for name in DAMAGE}, **{name: RELEASES for name in REGISTRY_DAMAGE}}

# Every command that reads manifests, with arguments that would otherwise run it.
COMMANDS = {
    "apply-patches": [],
    "apply-patches --check": ["--check"],
    "check-install": ["--tree", "{tmp}"],
    "build-wheel": ["--out", "{tmp}/dist"],
    "lint-patches": [],
    "review": [],
    "race-check": [],
}


@pytest.fixture(scope="module")
def scratch_projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One scratch copy of the project per damage, its default pin.toml damaged.

    The copy keeps scripts/' bytecode (its sources keep their times, so it stays valid).
    """
    projects = {}
    for name, (old, new, _key) in {**DAMAGE, **REGISTRY_DAMAGE}.items():
        root = tmp_path_factory.mktemp("project")
        for part in ("scripts", "patches"):
            shutil.copytree(paths.PROJECT_ROOT / part, root / part)
        damaged = root / "patches" / FILE[name]
        text = damaged.read_text(encoding="utf-8")
        assert old in text, f"{old!r} is not in {damaged.name}; the case is out of date"
        damaged.write_text(text.replace(old, new, 1), encoding="utf-8")
        projects[name] = root
    return projects


@pytest.fixture(scope="module")
def servers(
    scratch_projects: dict[str, Path],
) -> Iterator[dict[str, CommandServer]]:
    """Per damage, a server of forked runs of its project's commands (command_server.py)."""
    made = {name: CommandServer(root / "scripts") for name, root in scratch_projects.items()}
    yield made
    for server in made.values():
        server.stop()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", FILE)
def test_damaged_manifest_is_exit_6_naming_key_and_file(
    scratch_projects: dict[str, Path],
    servers: dict[str, CommandServer],
    tmp_path: Path,
    damage: str,
    command: str,
) -> None:
    root = scratch_projects[damage]
    script, *flags = command.split()
    args = [a.format(tmp=tmp_path) for a in [*flags, *COMMANDS[command]]]
    env = dict(
        os.environ,
        SGLANG_BACKPORTS_BUILD=str(tmp_path / "build"),
        SGLANG_BACKPORTS_CACHE=str(tmp_path / "cache"),
    )
    if damage == next(iter(FILE)):  # every command started as a user starts it, once
        result = subprocess.run(
            [sys.executable, str(root / "scripts" / script), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
    else:
        result = servers[damage].run(root / "scripts" / script, args, env=env, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == Exit.PATCHSET_INVALID, output
    assert "Traceback" not in output and "KeyError" not in output
    damaged = root / "patches" / FILE[damage]
    key = {**DAMAGE, **REGISTRY_DAMAGE}[damage][2]
    # one line names the file and the key
    assert re.search(rf"{re.escape(str(damaged))}.*{re.escape(key)}", output), output
    # nothing was downloaded or built before the refusal
    assert not (tmp_path / "cache").exists() and not (tmp_path / "dist").exists()
