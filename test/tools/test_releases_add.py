"""docs/maintaining.md's "Adding a release", walked on a scratch copy of the project.

0.5.14 (a two-step series) and 0.5.16 (fix A shipped, so 0002 alone) are
each taken out (the patch set folder and its [releases."X"] table) and added
again by the written steps: its facts from its wheel (the
cached one, sha256-checked), a pin.toml skeleton, apply-patches to lay out
the build tree, the ported commits (for a re-add, the old patches), then
export-patches and lint-patches. The result must be the committed patch set
byte for byte.

To keep this cheap, the build tree is laid out from a wheel that holds only
the three touched files (the same git calls; the full layout is covered by
test_apply_patches), so the skeleton pins that wheel's sha256 until the end.
The [races] step (scripts/race-check --write-expected) needs a whole tree to
import; that the committed tables are what it writes is checked by `.ci/run`
(race-check --check-expected) and test_racecheck_tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import fetch_or_skip
from patchset import paths, wheel
from patchset.git import Git
from patchset.manifest import Series, git_blob_id, sha256_of

RACES_COMMENT = "# The race checker's expected table"


def table_body(text: str, header: str) -> tuple[int, int]:
    """Where the key lines of [header] start and end in text."""
    start = text.index(f"[{header}]\n") + len(header) + 3
    end = text.index("\n\n", start) + 1
    return start, end


def run(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    result = subprocess.run(
        [sys.executable, str(root / "scripts" / command), *rest],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


@pytest.mark.parametrize("release", ["0.5.14", "0.5.16"])
def test_re_adding_a_release_gives_the_same_patch_set(tmp_path: Path, release: str) -> None:
    committed = paths.PATCHES_ROOT / f"sglang-{release}"
    old = Series.load(committed).manifest
    known = list(old.registry.known)
    after = known[known.index(release) + 1]
    root = tmp_path / "project"
    for part in ("scripts", "patches"):
        shutil.copytree(
            paths.PROJECT_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__")
        )
    folder = root / "patches" / f"sglang-{release}"
    shutil.rmtree(folder)
    registry = root / "patches" / "releases.toml"
    registry_text = registry.read_text(encoding="utf-8")
    entry_start = registry_text.index(f'[releases."{release}"]\n')
    entry_end = registry_text.index(f'[releases."{after}"]\n')
    registry.write_text(registry_text[:entry_start] + registry_text[entry_end:], encoding="utf-8")

    # 1. The release's facts, from its wheel: the blob id of each touched file.
    release_wheel = fetch_or_skip(old.base, paths.cache_dir())  # sha256-checked
    files = wheel.read_files(release_wheel, old.files)
    blobs = ", ".join(f"{json.dumps(p)} = {json.dumps(git_blob_id(d))}" for p, d in files.items())
    fixes = json.dumps(sorted(old.step_fixes["base"]))
    entry = f'[releases."{release}"]\nfixes = {fixes}\nblobs = {{ {blobs} }}\n\n'
    text = registry.read_text(encoding="utf-8")
    at = text.index(f'[releases."{after}"]\n')
    registry.write_text(text[:at] + entry + text[at:], encoding="utf-8")
    assert registry.read_text(encoding="utf-8") == registry_text

    # 2. The pin.toml skeleton: the neighbour's, with this release's [sglang],
    # no patches, the base's blob ids only and no race tables yet.
    pin_text = (committed / "pin.toml").read_text(encoding="utf-8")
    start, end = table_body(pin_text, "patches")
    skeleton = pin_text[:start] + pin_text[end:]
    start, end = table_body(skeleton, "blobs")
    base_only = "".join(
        f'{json.dumps(p)} = {{ "base" = {json.dumps(git_blob_id(d))} }}\n' for p, d in files.items()
    )
    skeleton = skeleton[:start] + base_only + skeleton[end:]
    skeleton = skeleton[: skeleton.index(RACES_COMMENT)].rstrip("\n") + "\n"
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
    (folder / "pin.toml").write_text(
        skeleton.replace(old.base.sha256, sha256_of(slim)), encoding="utf-8"
    )
    env = dict(
        os.environ,
        SGLANG_BACKPORTS_BUILD=str(tmp_path / "build"),
        SGLANG_BACKPORTS_CACHE=str(cache),
    )

    # 3. Lay out the build tree (pristine tag, empty branch) and port the commits.
    run(root, env, "apply-patches", "--patch-set", str(folder))
    repo = tmp_path / "build" / f"sglang-{release}"
    Git(repo, owned=True).run(
        "am", "--quiet", *(str(p) for p in Series.load(committed).patch_paths)
    )

    # 4. Export the series, then lint it.
    run(root, env, "export-patches", "--patch-set", str(folder))
    pin = folder / "pin.toml"
    pin.write_text(
        pin.read_text(encoding="utf-8").replace(sha256_of(slim), old.base.sha256), encoding="utf-8"
    )
    lint = run(root, env, "lint-patches", "--patch-set", str(folder))
    assert f"lint ok: {len(old.patch_hashes)} patches" in lint.stdout

    # The same patch set, byte for byte (pin.toml up to its race tables).
    names = sorted(p.name for p in committed.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == names
    for name in names:
        if name != "pin.toml":
            assert (folder / name).read_bytes() == (committed / name).read_bytes(), name
    assert pin.read_text(encoding="utf-8") + "\n" + pin_text[pin_text.index(RACES_COMMENT) :] == (
        pin_text
    )
    assert re.search(r"^\[races\.", pin.read_text(encoding="utf-8"), re.M) is None
