"""apply-patches on every served release: --base lays one out, --sglang recognises one.

Each release's wheel comes through the project's own pinned, hash-checked path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunScript, commit_all, fetch_or_skip, git, repo_state, slim_checkout_of
from patchset import paths
from patchset.errors import Exit
from patchset.manifest import Series, series_for_release

# One release per shape: a shared series, two-step bases, a one-step base with fix A.
RELEASES = ["0.5.13.post1", "0.5.14", "0.5.16", "0.5.18"]
# Laying a whole release out takes seconds: a shared two-step series and a one-step
# base (scripts/run-tests lays out every release, and the default one is in
# test_apply_patches).
LAID_OUT = ["0.5.13.post1", "0.5.18"]


def served(version: str) -> Series:
    return series_for_release(paths.PATCHES_ROOT, version)


def checkout_of(version: str, folder: Path, cache: Path) -> Path:
    """A git checkout of the release's files that the series touches (see slim_checkout_of)."""
    series = served(version)
    wheel_file = fetch_or_skip(series.manifest.base, cache)
    return slim_checkout_of(wheel_file, series.manifest.files, folder, f"v{version}")


@pytest.mark.parametrize("version", LAID_OUT)
def test_base_lays_out_that_release_and_a_second_run_changes_nothing(
    forked_script: RunScript, tmp_path: Path, wheel_cache: Path, version: str
) -> None:
    series = served(version)
    fetch_or_skip(series.manifest.base, wheel_cache)
    first = forked_script("apply-patches", "--base", version)
    assert first.returncode == 0, first.stderr
    repo = tmp_path / "build" / f"sglang-{version}"
    final = series.manifest.blobs_at(series.manifest.final_step)
    assert {p: git(repo, "rev-parse", f"HEAD:{p}") for p in final} == final
    assert [line.split(": ")[1] for line in first.stdout.splitlines() if "applied: " in line] == (
        series.patch_names
    )
    before = repo_state(repo)
    second = forked_script("apply-patches", "--base", version)
    assert second.returncode == 0, second.stderr
    assert "already applied" in second.stdout
    assert repo_state(repo) == before


@pytest.mark.parametrize("version", RELEASES)
def test_a_checkout_of_a_served_release_gets_that_release_series(
    forked_script: RunScript, tmp_path: Path, wheel_cache: Path, version: str
) -> None:
    repo = checkout_of(version, tmp_path / "sglang", wheel_cache)
    series = served(version)
    result = forked_script("apply-patches", "--sglang", str(repo))
    assert result.returncode == 0, result.stderr
    # The three files cannot tell releases that share a series apart: the branch
    # is named after the series' own release.
    branch = f"sglang-backports/{Series.load(series.folder).manifest.base.version}"
    final = series.manifest.blobs_at(series.manifest.final_step)
    assert {p: git(repo, "rev-parse", f"{branch}:{p}") for p in final} == final
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    again = forked_script("apply-patches", "--sglang", str(repo))
    assert again.returncode == 0 and "already applied" in again.stdout


def test_a_fixed_release_is_refused_as_already_upstream(
    forked_script: RunScript, tmp_path: Path, series: Series, upstream_fixed_wheel: Path
) -> None:
    repo = slim_checkout_of(
        upstream_fixed_wheel, series.manifest.files, tmp_path / "sglang", "v0.5.19"
    )
    before = repo_state(repo)
    result = forked_script("apply-patches", "--sglang", str(repo))
    assert result.returncode == Exit.ALREADY_UPSTREAM, result.stderr
    assert "already contains the fixes" in result.stderr
    assert repo_state(repo) == before


def test_an_unknown_tree_is_refused_naming_the_nearest_release(
    forked_script: RunScript, tmp_path: Path, wheel_cache: Path
) -> None:
    repo = checkout_of("0.5.14", tmp_path / "sglang", wheel_cache)
    decode = repo / "python/sglang/srt/disaggregation/decode.py"
    decode.write_text(decode.read_text() + "\n# a local change\n")
    commit_all(repo, "local change")
    before = repo_state(repo)
    result = forked_script("apply-patches", "--sglang", str(repo))
    assert result.returncode == Exit.BASE_MISMATCH, result.stderr
    assert "the nearest is sglang 0.5.14" in result.stderr
    assert repo_state(repo) == before


def test_an_unknown_base_version_is_refused_naming_the_nearest(forked_script: RunScript) -> None:
    result = forked_script("apply-patches", "--base", "0.5.12")
    assert result.returncode == Exit.BASE_MISMATCH
    assert "nearest release served is 0.5.13" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unpatched_0513_is_not_taken_for_a_fixed_release(
    forked_script: RunScript, tmp_path: Path, wheel_cache: Path, series: Series
) -> None:
    """0.5.13's event loop holds fix B's line elsewhere; only get_new_prebuilt_batch counts."""
    repo = checkout_of("0.5.13", tmp_path / "sglang", wheel_cache)
    result = forked_script(
        "apply-patches", "--check", "--sglang", str(repo), "--patch-set", str(series.folder)
    )
    assert result.returncode == Exit.BASE_MISMATCH, result.stderr
    assert "It looks like sglang 0.5.13.post1." in result.stderr
