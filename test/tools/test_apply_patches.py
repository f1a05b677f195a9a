"""scripts/apply-patches: the default build tree, a user's checkout, --check, refusals."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    SCRIPTS,
    RunScript,
    SlimSet,
    blobs,
    commit_all,
    git,
    repin,
    repo_state,
    slim_patch_set,
)
from patchset import wheel
from patchset.errors import Exit
from patchset.git import Git
from patchset.manifest import Series

BRANCH = "sglang-backports/0.5.15.post1"
DECODE = "python/sglang/srt/disaggregation/decode.py"
OVERLAP = "python/sglang/srt/managers/overlap_utils.py"


# --- the default: the pinned wheel laid out under build/ -------------------


# The default run on the whole tree, and a second run that changes nothing: with
# test_four_runs_at_once_on_one_build_folder (test_apply_concurrency.py), whose four
# runs lay the same tree out once.


def test_check_on_the_default_base_changes_nothing(
    run_script: RunScript, tmp_path: Path, series: Series
):
    result = run_script("apply-patches", "--check")
    assert result.returncode == 0, result.stderr
    for name in series.patch_names:
        assert f"{name}: applies cleanly" in result.stdout
    assert not (tmp_path / "build").exists()


# --- a user's own checkout ---------------------------------------------------


# A user's whole checkout gets a new branch and keeps its own: with
# test_four_runs_at_once_on_one_checkout (test_apply_concurrency.py).


def test_user_checkout_second_run_says_already_applied(run_script: RunScript, checkout: Path):
    assert run_script("apply-patches", "--sglang", str(checkout)).returncode == 0
    before = repo_state(checkout)
    again = run_script("apply-patches", "--sglang", str(checkout))
    assert again.returncode == 0, again.stderr
    assert "already applied" in again.stdout
    assert repo_state(checkout) == before


def test_checkout_already_on_the_patched_branch_is_a_no_op(
    forked_script: RunScript, checkout: Path
):
    assert forked_script("apply-patches", "--sglang", str(checkout)).returncode == 0
    git(checkout, "switch", "-q", BRANCH)
    result = forked_script("apply-patches", "--sglang", str(checkout), "--branch", "other")
    assert result.returncode == 0, result.stderr
    assert "already applied" in result.stdout
    assert "refs/heads/other" not in repo_state(checkout)["refs"]


def test_checkout_with_only_the_first_patch_gets_the_rest(
    forked_script: RunScript, checkout: Path, series: Series
):
    first = series.patch_paths[0]
    git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", str(first))
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == 0, result.stderr
    assert f"already in the base: {first.name}" in result.stdout
    assert f"applied: {series.patch_names[1]}" in result.stdout
    assert blobs(checkout, BRANCH, series) == series.manifest.blobs_at("0002")


def test_check_on_a_checkout_reports_each_patch_and_changes_nothing(
    forked_script: RunScript, checkout: Path, series: Series
):
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout), "--check")
    assert result.returncode == 0, result.stderr
    assert [line.strip() for line in result.stdout.splitlines()[1:]] == [
        f"{name}: applies cleanly" for name in series.patch_names
    ]
    assert repo_state(checkout) == before


def test_check_reports_a_patch_that_would_not_apply(
    forked_script: RunScript, broken_second_patch: Path, slim_set: SlimSet, series: Series
):
    result = forked_script(
        "apply-patches", "--check", "--patch-set", str(broken_second_patch), env=slim_set.env
    )
    assert result.returncode == Exit.WOULD_NOT_APPLY
    assert f"{series.patch_names[0]}: applies cleanly" in result.stdout
    assert f"{series.patch_names[1]}: does not apply" in result.stdout


# --- refusals: a message, a non-zero exit, nothing touched ------------------


def test_dirty_work_tree_is_refused_by_name(forked_script: RunScript, checkout: Path):
    (checkout / DECODE).write_text((checkout / DECODE).read_text() + "# local edit\n")
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.DIRTY_TREE
    assert DECODE in result.stderr
    assert "next step:" in result.stderr
    assert repo_state(checkout) == before


def test_unknown_base_is_refused_naming_the_file(forked_script: RunScript, checkout: Path):
    (checkout / OVERLAP).write_text((checkout / OVERLAP).read_text() + "# fork\n")
    commit_all(checkout, "a fork")
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.BASE_MISMATCH
    assert f"{OVERLAP}: blob" in result.stderr
    assert DECODE not in result.stderr  # only the file that differs is named
    assert "matches no sglang release" in result.stderr
    assert repo_state(checkout) == before


def test_fixed_release_is_refused_as_already_upstream(
    forked_script: RunScript, checkout: Path, series: Series, upstream_fixed_wheel: Path
):
    for path, data in wheel.read_files(upstream_fixed_wheel, series.manifest.files).items():
        (checkout / path).write_bytes(data)
    commit_all(checkout, "v0.5.19")
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.ALREADY_UPSTREAM
    assert "looks like sglang 0.5.19" in result.stderr
    assert "no patch is needed" in result.stderr
    assert repo_state(checkout) == before
    check = forked_script("apply-patches", "--sglang", str(checkout), "--check")
    assert check.returncode == Exit.ALREADY_UPSTREAM


def test_unknown_release_with_fix_b_is_refused_as_already_upstream(
    forked_script: RunScript, checkout: Path, series: Series
):
    patched = checkout / DECODE
    text = patched.read_text().replace(
        "        new_batch.process_prebuilt(self.server_args, self.future_map)\n",
        "        self.schedule_stream.wait_stream(self.forward_stream)\n"
        "        new_batch.process_prebuilt(self.server_args, self.future_map)\n",
    )
    patched.write_text(text)
    commit_all(checkout, "someone's own fix")
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.ALREADY_UPSTREAM
    assert "0.5.19 or later" in result.stderr


def test_changed_patch_file_is_refused(
    forked_script: RunScript, tmp_path: Path, patch_set: Path, series: Series
):
    folder = patch_set
    patch = folder / series.patch_names[0]
    patch.write_text(patch.read_text().replace("cumulative", "accumulating", 1))
    result = forked_script("apply-patches", "--patch-set", str(folder))
    assert result.returncode == Exit.PATCHSET_INVALID
    assert f"patch {patch.name} has sha256" in result.stderr
    assert not (tmp_path / "build").exists()


def test_path_that_is_not_a_checkout_is_refused(forked_script: RunScript, tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for target in (plain, tmp_path / "missing"):
        result = forked_script("apply-patches", "--sglang", str(target))
        assert result.returncode == Exit.NOT_A_CHECKOUT
        assert str(target) in result.stderr
        assert "next step:" in result.stderr
    assert list(plain.iterdir()) == []


def test_wheel_with_wrong_sha256_is_refused(
    forked_script: RunScript, tmp_path: Path, series: Series
):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / series.manifest.base.wheel).write_bytes(b"not the wheel")
    result = forked_script("apply-patches", env={"SGLANG_BACKPORTS_CACHE": str(cache)})
    assert result.returncode == Exit.WHEEL_HASH
    assert series.manifest.base.sha256 in result.stderr
    assert not (tmp_path / "build").exists()
    assert (cache / series.manifest.base.wheel).read_bytes() == b"not the wheel"


def test_no_network_and_no_cache_is_refused(
    forked_script: RunScript, tmp_path: Path, series: Series
):
    offline = {
        "SGLANG_BACKPORTS_CACHE": str(tmp_path / "empty-cache"),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    result = forked_script("apply-patches", env=offline)
    assert result.returncode == Exit.WHEEL_UNAVAILABLE
    assert series.manifest.base.wheel in result.stderr
    assert not (tmp_path / "build").exists()


def test_existing_branch_with_other_content_is_refused(forked_script: RunScript, checkout: Path):
    git(checkout, "branch", BRANCH)
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.BRANCH_EXISTS
    assert "--branch" in result.stderr
    assert repo_state(checkout) == before


# --- a patch that fails midway is rolled back --------------------------------


@pytest.fixture
def broken_second_patch(slim_set: SlimSet, series: Series) -> Path:
    """A patch set whose 0002 no longer applies (its context was edited), re-pinned.

    The slim set: its build tree holds only the touched files (run with slim_set.env).
    """
    folder = slim_set.folder
    second = folder / series.patch_names[1]
    second.write_text(
        second.read_text().replace(" # construct fake completed prefill", " # built elsewhere")
    )
    repin(folder)
    return folder


def test_failed_patch_rolls_back_a_user_checkout(
    forked_script: RunScript, checkout: Path, broken_second_patch: Path, series: Series
):
    before = repo_state(checkout)
    result = forked_script(
        "apply-patches", "--sglang", str(checkout), "--patch-set", str(broken_second_patch)
    )
    assert result.returncode == Exit.APPLY_FAILED
    assert f"patch {series.patch_names[1]} did not apply" in result.stderr
    assert "rolled back" in result.stderr
    assert repo_state(checkout) == before


def test_failed_patch_rolls_back_the_build_tree(
    forked_script: RunScript, tmp_path: Path, broken_second_patch: Path, slim_set: SlimSet
):
    result = forked_script(
        "apply-patches", "--patch-set", str(broken_second_patch), env=slim_set.env
    )
    assert result.returncode == Exit.APPLY_FAILED
    assert not (tmp_path / "build" / "sglang-0.5.15.post1").exists()


def test_failed_patch_keeps_an_existing_build_tree_as_it_was(
    forked_script: RunScript,
    tmp_path: Path,
    broken_second_patch: Path,
    slim_set: SlimSet,
    series: Series,
    wheel_cache: Path,
):
    # A build tree from an earlier run, holding only the pristine base.
    repo = tmp_path / "build" / "sglang-0.5.15.post1"
    intact, _cache = slim_patch_set(series, wheel_cache, tmp_path / "intact")
    assert (
        forked_script("apply-patches", "--patch-set", str(intact), env=slim_set.env).returncode == 0
    )
    owned = Git(repo, owned=True)
    owned.run("switch", "-q", "--detach", "pristine/0.5.15.post1")
    owned.run("branch", "-D", BRANCH)
    before = repo_state_detached(repo)
    result = forked_script(
        "apply-patches", "--patch-set", str(broken_second_patch), env=slim_set.env
    )
    assert result.returncode == Exit.APPLY_FAILED
    assert repo_state_detached(repo) == before


def repo_state_detached(repo: Path) -> dict[str, str]:
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git(repo, "rev-parse", "HEAD"),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


# --- help ----------------------------------------------------------------------


def test_help_documents_only_its_own_exit_codes(run_script: RunScript):
    result = run_script("apply-patches", "--help")
    assert result.returncode == 0
    documented = {int(m) for m in re.findall(r"^\s+(\d+)\s{2}", result.stdout, re.MULTILINE)}
    assert documented == {*range(0, 13), Exit.ENVIRONMENT, Exit.LOCKED, Exit.INTERRUPTED}
    assert Exit.RACE not in documented and Exit.STALE not in documented


def test_build_tree_with_an_older_series_says_to_rebuild_it(
    forked_script: RunScript, tmp_path: Path, slim_set: SlimSet
):
    slim = ("--patch-set", str(slim_set.folder))
    assert forked_script("apply-patches", *slim, env=slim_set.env).returncode == 0
    repo = tmp_path / "build" / "sglang-0.5.15.post1"
    owned = Git(repo, owned=True)
    owned.run("commit", "-q", "--allow-empty", "-m", "an older series' extra commit")
    (repo / DECODE).write_text("# not the patched file\n")
    owned.run("commit", "-q", "--all", "-m", "older content")
    before = repo_state(repo)
    result = forked_script("apply-patches", *slim, env=slim_set.env)
    assert result.returncode == Exit.BRANCH_EXISTS
    assert f"delete {repo} (it is generated)" in result.stderr
    assert repo_state(repo) == before


# --- a hostile environment: hooks, signing, bad names, paths, folders ----------


def test_user_hooks_and_signing_do_not_run(
    forked_script: RunScript, checkout: Path, series: Series, tmp_path: Path
):
    ran = tmp_path / "hooks-ran"
    hooks = checkout / ".git" / "hooks"
    for hook in ("post-checkout", "applypatch-msg", "pre-applypatch", "post-applypatch"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {ran}\nexit 1\n")
        (hooks / hook).chmod(0o755)
    git(checkout, "config", "commit.gpgsign", "true")
    git(checkout, "config", "gpg.program", str(tmp_path / "no-such-gpg"))
    git(checkout, "config", "am.threeWay", "true")
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == 0, result.stderr
    assert not ran.exists()
    assert blobs(checkout, BRANCH, series) == series.manifest.blobs_at("0002")


@pytest.mark.parametrize("name", ["a..b", "../x", "foo.lock", "-x", "", "refs/heads/x", "@{-1}"])
def test_bad_branch_name_is_refused_as_usage(forked_script: RunScript, checkout: Path, name: str):
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout), f"--branch={name}")
    assert result.returncode == Exit.USAGE, result.stderr
    assert "--branch" in result.stderr and "Traceback" not in result.stderr
    assert repo_state(checkout) == before


def test_relative_paths_are_resolved_before_use(
    forked_script: RunScript, checkout: Path, patch_set: Path, tmp_path: Path, series: Series
):
    relative = patch_set.relative_to(tmp_path)
    for extra in (["--check"], []):
        result = forked_script(
            "apply-patches", "--sglang", "sglang", "--patch-set", str(relative), *extra
        )
        assert result.returncode == 0, result.stderr
    assert blobs(checkout, BRANCH, series) == series.manifest.blobs_at("0002")


def test_base_that_holds_the_series_claims_no_branch(
    forked_script: RunScript, checkout: Path, series: Series
):
    for patch in series.patch_paths:
        git(checkout, "am", "-q", str(patch))
    before = repo_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == 0, result.stderr
    assert "already applied" in result.stdout
    assert BRANCH not in result.stdout and "(branch" not in result.stdout
    assert repo_state(checkout) == before


def test_no_home_is_refused(forked_script: RunScript, tmp_path: Path):
    env = {"HOME": "", "XDG_CACHE_HOME": "", "SGLANG_BACKPORTS_CACHE": ""}
    result = forked_script("apply-patches", env=env)
    assert result.returncode == Exit.ENVIRONMENT, result.stderr
    assert "HOME is not set" in result.stderr and "SGLANG_BACKPORTS_CACHE" in result.stderr
    assert not (tmp_path / "build").exists()


def test_cache_path_that_is_a_file_is_refused(forked_script: RunScript, tmp_path: Path):
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder\n")
    result = forked_script("apply-patches", env={"SGLANG_BACKPORTS_CACHE": str(cache)})
    assert result.returncode == Exit.ENVIRONMENT, result.stderr
    assert str(cache) in result.stderr and "next step:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def shared_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder another user can reach (pytest's own tmp folder is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="apply-readonly-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(folder)


def run_as_someone_else(
    command: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run as nobody when we are root, for whom no folder is read-only."""
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run(
        (prefix if os.geteuid() == 0 else []) + command,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd="/",
    )


@pytest.mark.parametrize("read_only", ["build", "cache"])
def test_read_only_folder_is_refused(
    shared_folder: Path, wheel_cache: Path, series: Series, read_only: str
):
    folders = {name: shared_folder / name for name in ("build", "cache", "home")}
    for folder in folders.values():
        folder.mkdir()
        folder.chmod(0o777)
    if read_only == "build":
        shutil.copy(wheel_cache / series.manifest.base.wheel, folders["cache"])
    folders[read_only].chmod(0o555)
    # The other user runs a copy of the commands and patch sets: the clone itself
    # may sit in a folder only its owner can enter (mktemp -d makes such folders).
    project = shared_folder / "project"
    for part in ("scripts", "patches"):
        shutil.copytree(
            SCRIPTS.parent / part, project / part, ignore=shutil.ignore_patterns("__pycache__")
        )
    result = run_as_someone_else(
        [sys.executable, str(project / "scripts" / "apply-patches")],
        {
            "SGLANG_BACKPORTS_BUILD": str(folders["build"]),
            "SGLANG_BACKPORTS_CACHE": str(folders["cache"]),
            "HOME": str(folders["home"]),
        },
    )
    assert result.returncode == Exit.ENVIRONMENT, result.stderr
    assert str(folders[read_only]) in result.stderr
    assert "next step:" in result.stderr and "Traceback" not in result.stderr
    assert list(folders["build"].iterdir()) == []
