"""docs/maintaining.md's "Adding a release", every step walked on a scratch copy.

0.5.14 (a two-step series) and 0.5.16 (fix A shipped, so 0002 alone) are
each taken out (the patch set folder and its [releases."X"] table) and added
again by the written steps: its facts and launch profile, a pin.toml skeleton
whose [writers] are the release before's, apply-patches to lay out the build
tree, the ported commits (for a re-add, the old patches), export-patches and
lint-patches, the race tables, the writers the scan finds unclassified, the
review, and the README's row. The result must be the committed patch set
byte for byte.

To keep this cheap:
- the build tree is laid out from a wheel that holds only the three touched
  files (the same git calls; the full layout is covered by
  test_apply_patches), so the skeleton pins that wheel's sha256 until the end;
- the [races] step writes the tables from the committed measurement through
  race-check --write-expected's own writer (commands.race_check.expected_tables);
  the measurement itself is each step run's (test/steps/test_race_scenarios.py
  asserts every cell of its step's column);
- the writers step runs `race-check --writers --tree` on the release's wheel
  sources that may hold a writer (the files the scan would parse), with the
  series' three files from the build tree: what the build tree's scan reads;
- the commands run in children forked from a command server of the scratch
  copy's scripts/ (test/tools/command_server.py), which imports each command
  once, not in a new interpreter each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from command_server import CommandServer
from commands import race_check as cli
from conftest import fetch_or_skip
from patchset import paths, wheel
from patchset.errors import Exit
from patchset.git import Git
from patchset.manifest import (
    RELEASES_NAME,
    Series,
    git_blob_id,
    load_releases,
    series_for_release,
    sha256_of,
)
from patchset.plays import SCENARIOS
from racecheck import report, writers
from test_racecheck_tables import measured_runs
from testrun.venv import env_name

FIRST_RACE_TABLE = "[races.S1]\n"


def table_body(text: str, header: str) -> tuple[int, int]:
    """Where the key lines of [header] start and end in text."""
    start = text.index(f"[{header}]\n") + len(header) + 3
    end = text.index("\n\n", start) + 1
    return start, end


def with_body(text: str, header: str, body: str) -> str:
    start, end = table_body(text, header)
    return text[:start] + body + text[end:]


def run(
    server: CommandServer, env: dict[str, str], *args: str, code: int = Exit.OK
) -> subprocess.CompletedProcess[str]:
    """scripts/COMMAND ARGS of the scratch project, forked from its own command server."""
    command, *rest = args
    result = server.run(server.scripts / command, rest, env=env, cwd=server.scripts.parent)
    assert result.returncode == code, f"{args}: {result.stdout}{result.stderr}"
    return result


def own_writers(pin_text: str) -> str:
    """The key lines of a pin.toml's [writers]: the rows only that base has."""
    start, end = table_body(pin_text, "writers")
    return pin_text[start:end]


def scanned(result: subprocess.CompletedProcess[str]) -> set[str]:
    """The writers race-check --writers found, by key (its table: WRITER | FILE:LINE | ...)."""
    keys = set()
    for line in result.stdout.splitlines()[2:]:
        cells = line.split(" | ")
        if len(cells) == 5:
            keys.add(f"{cells[1].rsplit(':', 1)[0]} {cells[0]}")
    return keys


def readme_row(release: str) -> list[str]:
    """The README's "Releases served" row that names release."""
    text = (paths.PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Releases served") :].split("\n\n")[1]
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if release in cells[0].replace(" (default)", "").split(", "):
            return cells
    raise AssertionError(f"README.md's Releases served table has no row for {release}")


@pytest.fixture
def commands(tmp_path: Path) -> Iterator[CommandServer]:
    """A command server of the scratch project's scripts/ (started on its first run)."""
    server = CommandServer(tmp_path / "project" / "scripts")
    yield server
    server.stop()


@pytest.mark.parametrize("release", ["0.5.14", "0.5.16"])
def test_re_adding_a_release_gives_the_same_patch_set(
    tmp_path: Path, release: str, commands: CommandServer
) -> None:
    committed = paths.PATCHES_ROOT / f"sglang-{release}"
    old = Series.load(committed).manifest
    known = list(old.registry.known)
    before, after = (known[known.index(release) + i] for i in (-1, 1))
    root = commands.scripts.parent
    # with scripts' bytecode (conftest compiles it once; the copies keep the sources' mtimes,
    # so it stays valid): each command started in the copy does not compile its modules again
    for part in ("scripts", "patches"):
        shutil.copytree(paths.PROJECT_ROOT / part, root / part)
    folder = root / "patches" / f"sglang-{release}"
    shutil.rmtree(folder)
    registry = root / "patches" / RELEASES_NAME
    registry_text = registry.read_text(encoding="utf-8")
    entry_start = registry_text.index(f'[releases."{release}"]\n')
    entry_end = registry_text.index(f'[releases."{after}"]\n')
    registry.write_text(registry_text[:entry_start] + registry_text[entry_end:], encoding="utf-8")

    # 1. The release's facts, from its wheel: the blob id of each touched file, and
    # the [launch.PROFILE] its ServerArgs matches (one already there: each profile
    # serves several releases; test_check_install_config checks the match).
    release_wheel = fetch_or_skip(old.base, paths.cache_dir())  # sha256-checked
    files = wheel.read_files(release_wheel, old.files)
    blobs = ", ".join(f"{json.dumps(p)} = {json.dumps(git_blob_id(d))}" for p, d in files.items())
    fixes = json.dumps(sorted(old.step_fixes["base"]))
    profile = old.registry.launch[release].profile
    assert f"\n[launch.{profile}]\n" in registry.read_text(encoding="utf-8")
    entry = (
        f'[releases."{release}"]\nfixes = {fixes}\nlaunch = "{profile}"\nblobs = {{ {blobs} }}\n\n'
    )
    text = registry.read_text(encoding="utf-8")
    at = text.index(f'[releases."{after}"]\n')
    registry.write_text(text[:at] + entry + text[at:], encoding="utf-8")
    assert registry.read_text(encoding="utf-8") == registry_text

    # 2. The pin.toml skeleton: this release's [sglang], no patches, no blob ids
    # (the base's are step 1's), no race tables yet, and the [writers] rows of
    # the release before's base.
    pin_text = (committed / "pin.toml").read_text(encoding="utf-8")
    neighbour = series_for_release(paths.PATCHES_ROOT, before).folder / "pin.toml"
    neighbour_rows = own_writers(neighbour.read_text(encoding="utf-8"))
    skeleton = with_body(with_body(pin_text, "patches", ""), "blobs", "")
    skeleton = with_body(skeleton, "writers", neighbour_rows)
    skeleton = skeleton[: skeleton.index(FIRST_RACE_TABLE)].rstrip("\n") + "\n"
    folder.mkdir()
    (folder / "series").write_text("", encoding="utf-8")
    # (only for this test: a wheel of the three touched files, see above)
    cache = tmp_path / "cache"
    cache.mkdir()
    slim = cache / old.base.wheel
    with zipfile.ZipFile(slim, "w") as archive:
        for path, data in files.items():
            member = zipfile.ZipInfo(path.removeprefix(wheel.REPO_PREFIX), (2026, 1, 1, 0, 0, 0))
            archive.writestr(member, data)
    pin = folder / "pin.toml"
    pin.write_text(skeleton.replace(old.base.sha256, sha256_of(slim)), encoding="utf-8")
    env = dict(
        os.environ,
        SGLANG_BACKPORTS_BUILD=str(tmp_path / "build"),
        SGLANG_BACKPORTS_CACHE=str(cache),
    )

    # 3. Lay out the build tree (pristine tag, empty branch).
    run(commands, env, "apply-patches", "--patch-set", str(folder))
    repo = tmp_path / "build" / f"sglang-{release}"

    # 4. Port the commits.
    Git(repo, owned=True).run(
        "am", "--quiet", *(str(p) for p in Series.load(committed).patch_paths)
    )

    # 5. Export the series, then lint it.
    run(commands, env, "export-patches", "--patch-set", str(folder))
    pin.write_text(
        pin.read_text(encoding="utf-8").replace(sha256_of(slim), old.base.sha256), encoding="utf-8"
    )
    lint = run(commands, env, "lint-patches", "--patch-set", str(folder))
    assert f"lint ok: {len(old.patch_hashes)} patches" in lint.stdout

    # 6. The race tables, as race-check --write-expected writes them from its run.
    series = Series.load(folder, load_releases(registry))
    measured = measured_runs(series, report.expected_table(old, SCENARIOS))
    assert cli.expected_tables([series], measured, write=True) == Exit.OK

    # 7. The writers: the scan names each writer the release before's rows miss;
    # classify those, and drop the rows of writers this release does not have.
    tree = tmp_path / "tree" / "python"
    with zipfile.ZipFile(release_wheel) as archive:
        for name in archive.namelist():
            source = archive.read(name) if name.endswith(".py") else b""
            if name == "sglang/__init__.py" or writers.may_hold_writers(
                source.decode("utf-8", "replace")
            ):
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / name).write_bytes(source)
    for path in files:
        (tree.parent / path).write_bytes((repo / path).read_bytes())
    scan_writers = ["race-check", "--writers", "--base", release, "--tree", str(tree.parent)]
    scan = run(commands, env, *scan_writers, code=Exit.RACE)
    ours, theirs = (set(re.findall(r'^"([^"]+)" = ', rows, re.M)) for rows in (
        own_writers(pin_text), neighbour_rows))  # fmt: skip
    assert ours != theirs
    unclassified = scan.stdout.split("does not classify: ")[1].strip().split(", ")
    assert sorted(unclassified) == sorted(ours - theirs)
    assert not (theirs - ours) & scanned(scan)
    pin.write_text(with_body(pin.read_text(encoding="utf-8"), "writers", own_writers(pin_text)))
    assert "every one classified" in run(commands, env, *scan_writers).stdout

    # 8. Review: every difference from upstream's fixed release explained.
    upstream = fetch_or_skip(old.registry.upstream_fixed, paths.cache_dir())
    shutil.copy(upstream, cache / upstream.name)
    run(commands, env, "review", "--patch-set", str(folder), "--strict")

    # 9. Say so: the README's row names the release's patch set, steps and environment.
    _served, _has, gets, patch_set, environment = readme_row(release)
    assert gets == ", ".join(old.steps[1:])
    assert f"-{release}`" in patch_set and environment == f"`{env_name(old)}`"

    # The same patch set, byte for byte.
    names = sorted(p.name for p in committed.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == names
    for name in names:
        assert (folder / name).read_bytes() == (committed / name).read_bytes(), name
