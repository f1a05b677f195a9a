"""scripts/export-patches: byte-stable export, stale detection, manifest rewrite.

The build trees here are slim (conftest.slim_patch_set: the touched files
only); the patches and blob ids are those of the whole tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunScript, SlimSet, repin
from patchset.errors import Exit
from patchset.git import Git
from patchset.manifest import PinManifest, Series, sha256_of

BRANCH = "sglang-backports/0.5.15.post1"
DECODE = "python/sglang/srt/disaggregation/decode.py"


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def applied_copy(forked_script: RunScript, slim_set: SlimSet) -> Path:
    """A copy of the patch set, with the real series applied in the build tree."""
    result = forked_script("apply-patches", "--patch-set", str(slim_set.folder), env=slim_set.env)
    assert result.returncode == 0, result.stderr
    return slim_set.folder


def test_committed_patch_set_is_up_to_date(
    run_script: RunScript, applied_copy: Path, series: Series
):
    committed = {n: b for n, b in folder_bytes(series.folder).items() if n != "pin.toml"}
    assert {n: b for n, b in folder_bytes(applied_copy).items() if n in committed} == committed
    result = run_script("export-patches", "--check", "--patch-set", str(applied_copy))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout


def test_exporting_again_changes_no_byte(forked_script: RunScript, applied_copy: Path):
    folder = applied_copy
    before = folder_bytes(folder)
    for _ in range(2):
        result = forked_script("export-patches", "--patch-set", str(folder))
        assert result.returncode == 0, result.stderr
        assert folder_bytes(folder) == before


def test_check_shows_a_stale_patch(forked_script: RunScript, applied_copy: Path, series: Series):
    folder = applied_copy
    patch = folder / series.patch_names[0]
    patch.write_text(patch.read_text().replace("cumulative", "accumulating", 1))
    repin(folder)
    before = folder_bytes(folder)
    result = forked_script("export-patches", "--check", "--patch-set", str(folder))
    assert result.returncode == Exit.STALE
    assert f"committed/{patch.name}" in result.stdout
    assert "-record, so the event stays accumulating: once it fires, every earlier" in result.stdout
    assert "+record, so the event stays cumulative: once it fires, every earlier" in result.stdout
    assert "stale" in result.stderr
    assert folder_bytes(folder) == before


def test_export_follows_an_edited_commit(
    forked_script: RunScript, applied_copy: Path, tmp_path: Path, series: Series
):
    """A maintainer amends 0002 on the branch; export rewrites patch and manifest."""
    folder = applied_copy
    repo = tmp_path / "build" / "sglang-0.5.15.post1"
    owned = Git(repo, owned=True)
    decode = repo / DECODE
    decode.write_text(
        decode.read_text().replace("Let it finish before seeding.", "Drain it first.")
    )
    owned.run("commit", "-q", "--all", "--amend", "--no-edit")
    result = forked_script("export-patches", "--patch-set", str(folder))
    assert result.returncode == 0, result.stderr
    second = folder / series.patch_names[1]
    assert "+            # prebuilt requests may now reuse. Drain it first." in second.read_text()
    manifest = PinManifest.load(folder / "pin.toml")
    assert manifest.patch_hashes[second.name] == sha256_of(second)
    assert manifest.blobs[DECODE]["0002"] == owned.out("rev-parse", f"HEAD:{DECODE}")
    assert manifest.blobs[DECODE]["0002"] != series.manifest.blobs[DECODE]["0002"]
    assert manifest.blobs_at("base") == series.manifest.blobs_at("base")
    # the base's blob ids stay releases.toml's: the export does not copy them in
    assert '"base"' not in (folder / "pin.toml").read_text(encoding="utf-8")
    # The untouched first patch is byte-identical.
    first = series.patch_names[0]
    assert (folder / first).read_bytes() == (series.folder / first).read_bytes()


def test_export_without_a_build_tree_says_what_to_run(run_script: RunScript):
    result = run_script("export-patches", "--check")
    assert result.returncode == Exit.NOT_A_CHECKOUT
    assert "run scripts/apply-patches first" in result.stderr
