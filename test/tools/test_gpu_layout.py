"""The offline GPU mode's step trees without git: step files made here, laid out and checked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_GPU = ROOT / "ci" / "run-gpu"
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import layout  # noqa: E402
from patchset.errors import BackportError, Exit  # noqa: E402
from patchset.manifest import Series, git_blob_id  # noqa: E402

DECODE = "python/sglang/srt/disaggregation/decode.py"


@pytest.fixture(scope="module")
def made_step_files(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path) -> Path:
    """What `ci/run-gpu step-files` writes, made by the command itself, once: read only."""
    out = tmp_path_factory.mktemp("made") / "step-files"
    result = subprocess.run(
        [sys.executable, str(RUN_GPU), "step-files", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"step files {out}: 6 files" in result.stdout
    return out


@pytest.fixture
def step_files(tmp_path: Path, made_step_files: Path) -> Path:
    """The command's step files, copied for a test to change."""
    return shutil.copytree(made_step_files, tmp_path / "step-files")


def test_step_files_hold_each_step_as_pinned(step_files: Path, series: Series) -> None:
    manifest = series.manifest
    written = sorted(p.relative_to(step_files).as_posix() for p in step_files.rglob("*.py"))
    assert written == sorted(f"{s}/{p}" for s in manifest.steps[1:] for p in manifest.files)
    for step in manifest.steps[1:]:
        for path, blob in manifest.blobs_at(step).items():
            assert git_blob_id((step_files / step / path).read_bytes()) == blob, (step, path)


def test_the_trees_are_laid_out_without_git(
    step_files: Path,
    series: Series,
    wheel_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_git = tmp_path / "bin"
    no_git.mkdir()
    monkeypatch.setenv("PATH", str(no_git))
    assert shutil.which("git") is None
    manifest = series.manifest
    wheel = wheel_cache / manifest.base.wheel
    trees = layout.lay_out(series, wheel, step_files, tmp_path / "trees")
    assert list(trees) == manifest.steps
    for step, tree in trees.items():
        assert (tree / "python" / "sglang" / "__init__.py").is_file()
        for path, blob in manifest.blobs_at(step).items():
            assert git_blob_id((tree / path).read_bytes()) == blob, (step, path)
    marker = manifest.registry.fixes["fix-b"].marker
    assert marker in (trees[manifest.final_step] / DECODE).read_text()
    assert marker not in (trees["base"] / DECODE).read_text()  # the link was replaced, not written
    # a second run replaces the trees it made
    again = layout.lay_out(series, wheel, step_files, tmp_path / "trees")
    assert again == trees and not list((tmp_path / "trees").rglob("*.partial*"))


def test_a_wrong_carried_file_is_refused(step_files: Path, tmp_path: Path) -> None:
    carried = step_files / "0002" / DECODE
    carried.write_text(carried.read_text() + "# edited\n")
    build = tmp_path / "build"
    result = subprocess.run(
        [sys.executable, str(RUN_GPU), "--offline", "--dry-run", "--wheelhouse",
         str(tmp_path / "none"), "--step-files", str(step_files)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "SGLANG_BACKPORTS_BUILD": str(build)},
    )  # fmt: skip
    assert result.returncode == Exit.SETUP, result.stderr
    assert f"error: the carried {carried} has blob id {git_blob_id(carried.read_bytes())}" in (
        result.stderr
    )
    assert f"pins 390495b8d4916143dade4d8a4e41748d8d77a6c7 for {DECODE} at step 0002" in (
        result.stderr
    )
    assert "next step: make them again where git is, with `ci/run-gpu step-files" in result.stderr
    assert "Traceback" not in result.stderr
    assert not build.exists()


@pytest.mark.parametrize("change", ["missing", "extra", "no-folder"])
def test_missing_or_extra_step_files_are_refused(
    step_files: Path, series: Series, change: str
) -> None:
    if change == "missing":
        (step_files / "0001" / DECODE).unlink()
        said = f"lacks 0001/{DECODE}, a touched file of step 0001"
    elif change == "extra":
        (step_files / "0002" / "python" / "setup.py").write_text("")
        said = "holds 0002/python/setup.py: no touched file of a step of sglang-0.5.15.post1"
    else:
        shutil.rmtree(step_files)
        said = "does not exist: the step trees cannot be laid out"
    with pytest.raises(BackportError) as err:
        layout.carried_files(series, step_files)
    assert err.value.code == Exit.SETUP
    assert said in err.value.problem


def test_a_tree_folder_it_did_not_make_is_left_alone(
    step_files: Path, series: Series, wheel_cache: Path, tmp_path: Path
) -> None:
    theirs = layout.tree_path(tmp_path / "trees", series, "base")
    theirs.mkdir(parents=True)
    (theirs / "keep").write_text("mine")
    with pytest.raises(BackportError, match="was not laid out by ci/run-gpu") as err:
        layout.lay_out(
            series, wheel_cache / series.manifest.base.wheel, step_files, tmp_path / "trees"
        )
    assert err.value.code == Exit.SETUP
    assert (theirs / "keep").read_text() == "mine"
