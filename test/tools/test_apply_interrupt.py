"""scripts/apply-patches killed or interrupted at each git call it makes.

A `git` first on PATH counts the calls and, at the N-th, sends a signal to the
command (its parent) before running the real git. For every N until a run ends
on its own: SIGINT before the branch exists must roll back to the state
before and say so (exit 130), SIGINT once it exists must end the run as
applied (exit 0); after SIGKILL the next run must remove what was left and end
in the patched tree; and the user's repository must hold nothing of ours at
the end. No git call of a run may be `git worktree` in the user's repository.
Each run gets a TMPDIR of its own, which must be empty once a run has ended
on its own: every folder a killed run made there (its temporary index, the
patches' messages, git's reading of each patch) is removed by the next run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import RunScript, SlimSet, blobs, git, repo_state
from patchset import lock
from patchset.apply import LOCK_NAME, TEMP_PREFIX
from patchset.errors import Exit
from patchset.manifest import Series

BRANCH = "sglang-backports/0.5.15.post1"
WRAPPER = """#!/bin/sh
n=0
read n 2>/dev/null < "$FAULT_COUNT"
n=$((n + 1))
echo "$n" > "$FAULT_COUNT"
echo "$PWD $*" >> "$FAULT_COUNT.log"
if [ "$n" = "$FAULT_AT" ]; then kill -"$FAULT_SIGNAL" "$PPID"; fi
exec {git} "$@"
"""


@pytest.fixture
def tmpdir_of_runs(tmp_path: Path) -> Path:
    """The TMPDIR of every run of a test: what a run leaves there is seen."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


@pytest.fixture
def faulty_git(tmp_path: Path) -> Path:
    """A folder holding the signalling git wrapper."""
    folder = tmp_path / "faulty-bin"
    folder.mkdir()
    real = shutil.which("git")
    assert real
    wrapper = folder / "git"
    wrapper.write_text(WRAPPER.format(git=real))
    wrapper.chmod(0o755)
    return folder


def run_with_fault(
    run_script: RunScript,
    faulty_git: Path,
    signal: str,
    at: int,
    *args: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str, int]:
    """Run apply-patches with the signal sent at git call `at`; (exit, stderr, calls made)."""
    count = faulty_git / "count"
    count.write_text("0")
    fault = {
        "PATH": f"{faulty_git}:{os.environ['PATH']}",
        "FAULT_COUNT": str(count),
        "FAULT_AT": str(at),
        "FAULT_SIGNAL": signal,
    }
    result = run_script("apply-patches", *args, env=(env or {}) | fault, interruptible=True)
    calls = (faulty_git / "count.log").read_text().splitlines()
    assert not [call for call in calls if " worktree " in f" {call} "], calls
    return result.returncode, result.stderr, int(count.read_text())


def assert_nothing_of_ours(repo: Path, tmpdir: Path) -> None:
    common = repo / ".git"
    assert not (common / LOCK_NAME).exists()
    assert not (common / "worktrees").exists() or not list((common / "worktrees").iterdir())
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert sorted(p.name for p in tmpdir.iterdir()) == []


@pytest.mark.parametrize("signal", ["INT", "KILL"])
def test_user_checkout_survives_a_signal_at_each_git_call(
    forked_script: RunScript,
    faulty_git: Path,
    tmpdir_of_runs: Path,
    checkout: Path,
    series: Series,
    signal: str,
):
    env = {"TMPDIR": str(tmpdir_of_runs)}
    before = repo_state(checkout)
    config = git(checkout, "config", "--local", "--list")
    final = series.manifest.blobs_at(series.manifest.final_step)
    at = 1
    while True:
        code, stderr, calls = run_with_fault(
            forked_script, faulty_git, signal, at, "--sglang", str(checkout), env=env
        )
        if calls < at:  # the run made fewer calls than `at`: it ended on its own
            assert code == Exit.OK, stderr
            break
        made_branch = BRANCH in git(checkout, "for-each-ref", "--format=%(refname)")
        if signal == "INT" and made_branch:
            # The branch is the run's one change: once made, the run has succeeded.
            assert code == Exit.OK, (at, stderr)
            assert "interrupted" not in stderr, at
            assert_nothing_of_ours(checkout, tmpdir_of_runs)
        elif signal == "INT":
            assert code == Exit.INTERRUPTED, (at, stderr)
            assert "interrupted" in stderr
            assert repo_state(checkout) == before, at
            assert_nothing_of_ours(checkout, tmpdir_of_runs)
        if made_branch:
            assert blobs(checkout, BRANCH, series) == final, at
        elif signal == "INT":
            at += 1  # rolled back to the state before: a rerun is the first run again
            continue
        rerun = forked_script("apply-patches", "--sglang", str(checkout), env=env)
        assert rerun.returncode == Exit.OK, (at, rerun.stderr)
        assert blobs(checkout, BRANCH, series) == final, at
        assert_nothing_of_ours(checkout, tmpdir_of_runs)
        assert git(checkout, "config", "--local", "--list") == config
        git(checkout, "branch", "-D", BRANCH)
        assert repo_state(checkout) == before, at
        at += 1
    assert at > 5  # the loop did go through the run's git calls


@pytest.mark.parametrize("signal", ["INT", "KILL"])
def test_build_tree_survives_a_signal_at_each_git_call(
    forked_script: RunScript,
    faulty_git: Path,
    tmpdir_of_runs: Path,
    tmp_path: Path,
    series: Series,
    slim_set: SlimSet,
    signal: str,
):
    build = tmp_path / "build"
    repo = build / "sglang-0.5.15.post1"
    slim = ("--patch-set", str(slim_set.folder))
    env = slim_set.env | {"TMPDIR": str(tmpdir_of_runs)}
    at = 1
    left: list[Path] = []
    while True:
        code, stderr, calls = run_with_fault(forked_script, faulty_git, signal, at, *slim, env=env)
        # The leftovers of the run before were removed by this one.
        assert not any(folder.exists() for folder in left), at
        if calls < at:
            assert code == Exit.OK, stderr
            break
        # Every git call comes before the tree is renamed into place.
        assert not repo.exists(), at
        left = list(build.glob(TEMP_PREFIX + "*"))
        if signal == "INT":
            assert code == Exit.INTERRUPTED, (at, stderr)
            assert left == [], at
            assert not build.exists() or sorted(p.name for p in build.iterdir()) == [], at
        at += 1
    assert at > 5
    assert git(repo, "symbolic-ref", "--short", "HEAD") == BRANCH
    assert blobs(repo, "HEAD", series) == series.manifest.blobs_at(series.manifest.final_step)
    assert git(repo, "status", "--porcelain") == ""
    assert sorted(p.name for p in build.iterdir()) == [repo.name]
    assert sorted(p.name for p in tmpdir_of_runs.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_sweep_takes_only_this_users_leftovers(tmp_path: Path):
    """In a shared TMPDIR, another user's folder of ours is never judged, even by root."""
    made = [lock._make_marked(tmp_path, TEMP_PREFIX, "") for _ in range(2)]
    for _folder, fd in made:
        os.close(fd)  # its maker is gone
    (mine, _), (theirs, _) = made
    for path in (theirs, *theirs.iterdir()):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    assert lock.remove_leftovers(tmp_path, TEMP_PREFIX) == [mine]
    assert not mine.exists() and theirs.is_dir()
