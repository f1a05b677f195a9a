"""scripts/apply-patches run four times at once on one target, and a held lock."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import SCRIPTS, RunScript, blobs, commit_all, git, repo_state
from patchset.apply import LOCK_NAME
from patchset.errors import Exit
from patchset.lock import held
from patchset.manifest import Series, git_blob_id
from patchset.wheel import extract_package

BRANCH = "sglang-backports/0.5.15.post1"
DECODE = "python/sglang/srt/disaggregation/decode.py"


@pytest.fixture
def full_checkout(tmp_path: Path, series: Series, wheel_cache: Path) -> Path:
    """conftest's full_checkout as its one test here needs it, laid out once: a user's own
    repository of 0.5.15.post1's whole tree (a README beside python/, the release tag, the
    user's identity, an untracked file), committed where it is used; conftest's clones a
    session template, which lays the 3,700 files out and hashes them twice."""
    repo = tmp_path / "sglang"
    extract_package(wheel_cache / series.manifest.base.wheel, repo)
    (repo / "README.md").write_text("sglang\n")
    git(repo, "init", "-q", "--initial-branch=main")
    git(repo, "config", "user.name", "User")
    git(repo, "config", "user.email", "user@example.com")
    commit_all(repo, "v0.5.15.post1")
    git(repo, "tag", "v0.5.15.post1")
    (repo / "notes.txt").write_text("my notes\n")
    return repo


def start_four(build: Path, cache: Path, *args: str) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, SGLANG_BACKPORTS_BUILD=str(build), SGLANG_BACKPORTS_CACHE=str(cache))
    command = [sys.executable, str(SCRIPTS / "apply-patches"), "--wait", "600", *args]
    return [
        subprocess.Popen(
            command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]


def finish(runs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == Exit.OK, err
        outputs.append(out)
    return outputs


@pytest.fixture(scope="module")
def expected_tree(series: Series, wheel_cache: Path) -> dict[str, str]:
    """python/sglang/... -> blob id after the series: the wheel's files, the patched ones pinned
    (read and hashed once for both whole-tree tests)."""
    final = series.manifest.blobs_at(series.manifest.final_step)
    with zipfile.ZipFile(wheel_cache / series.manifest.base.wheel) as archive:
        tree = {
            "python/" + name: git_blob_id(archive.read(name))
            for name in archive.namelist()
            if name.startswith("sglang/") and not name.endswith("/")
        }
    assert set(final) <= set(tree)
    tree.update(final)
    return tree


def tree_at(repo: Path, rev: str) -> dict[str, str]:
    listing = git(repo, "ls-tree", "-r", "-z", rev, "--", "python/sglang")
    tree = {}
    for entry in listing.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            tree[path] = meta.split()[2]
    return tree


def test_four_runs_at_once_on_one_build_folder(
    forked_script: RunScript,
    tmp_path: Path,
    wheel_cache: Path,
    series: Series,
    expected_tree: dict[str, str],
):
    """Also the default run on the whole tree, and a later run that changes nothing."""
    build = tmp_path / "build"
    outputs = finish(start_four(build, wheel_cache))
    assert sum("patched tree:" in out for out in outputs) == 1
    assert sum("already applied" in out for out in outputs) == 3
    repo = build / "sglang-0.5.15.post1"
    (laid_out,) = [out for out in outputs if "patched tree:" in out]
    assert f"patched tree: {repo / 'python'}" in laid_out
    for name in series.patch_names:
        assert f"applied: {name}" in laid_out
    assert git(repo, "symbolic-ref", "--short", "HEAD") == BRANCH
    assert blobs(repo, "HEAD", series) == series.manifest.blobs_at("0002")
    assert blobs(repo, "pristine/0.5.15.post1", series) == series.manifest.blobs_at("base")
    assert "self.schedule_stream.wait_stream(self.forward_stream)" in (repo / DECODE).read_text()
    assert tree_at(repo, "HEAD") == expected_tree
    # The files on disk, not only the commit: every one of them, and no other.
    on_disk = {
        str(path.relative_to(repo)): git_blob_id(path.read_bytes())
        for path in (repo / "python" / "sglang").rglob("*")
        if path.is_file()
    }
    assert on_disk == expected_tree
    assert git(repo, "status", "--porcelain") == ""
    assert sorted(p.name for p in build.iterdir()) == [repo.name]
    before = repo_state(repo)
    again = forked_script("apply-patches")
    assert again.returncode == 0, again.stderr
    assert "already applied" in again.stdout
    assert repo_state(repo) == before


def test_four_runs_at_once_on_one_checkout(
    tmp_path: Path,
    wheel_cache: Path,
    series: Series,
    full_checkout: Path,
    expected_tree: dict[str, str],
):
    """Also: the user's whole checkout gets a new branch and keeps its own."""
    checkout = full_checkout
    head_before = git(checkout, "rev-parse", "HEAD")
    outputs = finish(start_four(tmp_path / "build", wheel_cache, "--sglang", str(checkout)))
    assert sum("patched branch" in out for out in outputs) == 1
    assert sum("already applied" in out for out in outputs) == 3
    assert sum(f"patched branch {BRANCH} created" in out for out in outputs) == 1
    assert git(checkout, "symbolic-ref", "--short", "HEAD") == "main"
    assert git(checkout, "rev-parse", "HEAD") == head_before
    assert (checkout / "notes.txt").read_text() == "my notes\n"
    assert git(checkout, "status", "--porcelain") == "?? notes.txt"
    assert blobs(checkout, BRANCH, series) == series.manifest.blobs_at("0002")
    subjects = git(checkout, "log", "--format=%s", f"main..{BRANCH}").splitlines()
    assert len(subjects) == len(series.patch_names)
    assert tree_at(checkout, BRANCH) == expected_tree
    assert len(git(checkout, "worktree", "list").splitlines()) == 1
    assert not (checkout / ".git" / LOCK_NAME).exists()


def test_a_held_lock_is_refused_naming_its_holder(forked_script: RunScript, checkout: Path):
    lock = checkout / ".git" / LOCK_NAME
    with held(lock, "test", 0):
        result = forked_script("apply-patches", "--sglang", str(checkout), "--wait", "0.5")
    assert result.returncode == Exit.LOCKED, result.stderr
    assert f"pid {os.getpid()}" in result.stderr
    assert "--wait" in result.stderr
    assert BRANCH not in git(checkout, "branch", "--list")
    assert not lock.exists()
    # Once the holder is gone, the next step (run again) works.
    assert forked_script("apply-patches", "--sglang", str(checkout)).returncode == Exit.OK


def test_a_held_build_lock_is_refused_and_check_needs_no_lock(
    forked_script: RunScript, tmp_path: Path
):
    build = tmp_path / "build"
    build.mkdir()
    with held(build / ".sglang-0.5.15.post1.lock", "test", 0):
        result = forked_script("apply-patches", "--wait", "0")
        check = forked_script("apply-patches", "--check")
    assert result.returncode == Exit.LOCKED, result.stderr
    assert f"pid {os.getpid()}" in result.stderr
    assert check.returncode == Exit.OK, check.stderr
    assert list(build.iterdir()) == []
