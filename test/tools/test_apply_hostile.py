"""apply-patches --sglang in a repository or environment that is not the usual one.

A sha256 repository, GIT_* variables that point git elsewhere, filter programs
and a split index configured by the user, a ref in the way of the branch's
name, and sglang vendored in a subfolder of a larger repository. In each the
run must do what it does in a plain checkout, or refuse saying what to pass,
and leave the user's repository, index and programs alone.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import RunScript, commit_all, git, repo_state, slim_checkout_of
from patchset import wheel
from patchset.errors import Exit
from patchset.manifest import Series, git_blob_id

BRANCH = "sglang-backports/0.5.15.post1"
DECODE = "python/sglang/srt/disaggregation/decode.py"


def content_ids(repo: Path, rev: str, series: Series, prefix: str = "") -> dict[str, str]:
    """path -> the sha1 blob id of its content at rev (in a repository of any object format)."""
    return {
        path: git_blob_id(
            subprocess.run(
                ["git", "cat-file", "blob", f"{rev}:{prefix}{path}"],
                cwd=repo,
                check=True,
                capture_output=True,
            ).stdout
        )
        for path in series.manifest.files
    }


def final_ids(series: Series) -> dict[str, str]:
    return series.manifest.blobs_at(series.manifest.final_step)


# --- object formats ------------------------------------------------------------------


def test_a_sha256_repository_is_recognised_by_content(
    forked_script: RunScript, tmp_path: Path, series: Series, wheel_cache: Path
):
    repo = tmp_path / "sglang"
    repo.mkdir()
    git(repo, "init", "-q", "--object-format=sha256")
    git(repo, "config", "user.email", "user@example.com")
    git(repo, "config", "user.name", "User")
    wheel_file = wheel_cache / series.manifest.base.wheel
    for path, data in wheel.read_files(wheel_file, series.manifest.files).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    commit_all(repo, "v0.5.15.post1")
    check = forked_script("apply-patches", "--check", "--sglang", str(repo))
    applied = forked_script("apply-patches", "--sglang", str(repo))
    # --check and the apply say the same
    assert check.returncode == Exit.OK, check.stdout + check.stderr
    assert check.stdout.count(": applies cleanly") == len(series.patch_names)
    assert applied.returncode == Exit.OK, applied.stderr
    assert content_ids(repo, BRANCH, series) == final_ids(series)
    assert len(git(repo, "rev-parse", BRANCH)) == 64
    again = forked_script("apply-patches", "--sglang", str(repo))
    assert again.returncode == Exit.OK and "already applied" in again.stdout, again.stderr


# --- GIT_* variables that point git elsewhere --------------------------------------


@pytest.fixture
def decoy(tmp_path: Path, slim_template: Path) -> Path:
    """Another clone of the same release: what a stray GIT_* variable points at."""
    repo = tmp_path / "decoy"
    subprocess.run(["git", "clone", "-q", str(slim_template), str(repo)], check=True)
    return repo


def decoy_state(repo: Path) -> tuple[str, str]:
    return repo_state(repo)["refs"], git(repo, "count-objects", "-v")


REDIRECTS = {
    "GIT_OBJECT_DIRECTORY": lambda decoy: str(decoy / ".git" / "objects"),
    "GIT_ALTERNATE_OBJECT_DIRECTORIES": lambda decoy: str(decoy / ".git" / "objects"),
    "GIT_COMMON_DIR": lambda decoy: str(decoy / ".git"),
    "GIT_DIR": lambda decoy: str(decoy / ".git"),
    "GIT_WORK_TREE": lambda decoy: str(decoy),
    "GIT_INDEX_FILE": lambda decoy: str(decoy / ".git" / "index"),
    "GIT_NAMESPACE": lambda decoy: "elsewhere",
    "GIT_CONFIG_PARAMETERS": lambda decoy: "'core.splitindex'='true'",
    "GIT_CONFIG_GLOBAL": lambda decoy: str(decoy / "global-config"),
}


@pytest.mark.parametrize("name", sorted(REDIRECTS))
def test_git_variables_of_the_caller_do_not_redirect_the_run(
    forked_script: RunScript, checkout: Path, decoy: Path, series: Series, name: str
):
    (decoy / "global-config").write_text("[core]\n\tsplitIndex = true\n")
    before = decoy_state(decoy)
    result = forked_script(
        "apply-patches", "--sglang", str(checkout), env={name: REDIRECTS[name](decoy)}
    )
    assert result.returncode == Exit.OK, result.stderr
    refs = git(checkout, "for-each-ref", "--format=%(refname)")
    assert f"refs/heads/{BRANCH}" in refs.splitlines(), refs
    fsck = subprocess.run(["git", "fsck", "--no-dangling"], cwd=checkout, capture_output=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert content_ids(checkout, BRANCH, series) == final_ids(series)
    assert list((checkout / ".git").glob("sharedindex.*")) == []
    assert decoy_state(decoy) == before


# --- the work-tree check reads and runs nothing of the user's -----------------------


SPY = "spy"


@pytest.fixture
def filtered(checkout: Path, tmp_path: Path) -> Path:
    """The checkout with a clean/smudge filter on every .py file, which logs each run."""
    log = tmp_path / "filter-ran"
    (checkout / ".gitattributes").write_text(f"*.py filter={SPY}\n")
    commit_all(checkout, "attributes")
    program = f"sh -c 'echo ran >> {shlex.quote(str(log))}; cat'"
    git(checkout, "config", f"filter.{SPY}.clean", program)
    git(checkout, "config", f"filter.{SPY}.smudge", program)
    git(checkout, "config", f"filter.{SPY}.required", "true")
    return log


def index_state(repo: Path) -> tuple[bytes, int]:
    index = repo / ".git" / "index"
    return hashlib.sha256(index.read_bytes()).digest(), index.stat().st_mtime_ns


def test_the_work_tree_check_runs_no_filter_and_writes_no_index(
    forked_script: RunScript, checkout: Path, filtered: Path, series: Series
):
    # Every file's stat differs from the index (as after a copy or a touch), its content not.
    later = (checkout / DECODE).stat().st_mtime + 100
    for path in series.manifest.files:
        os.utime(checkout / path, (later, later))
    before = index_state(checkout)
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.OK, result.stderr
    assert not filtered.exists(), "the user's filter program ran"
    assert index_state(checkout) == before, ".git/index was rewritten"
    assert content_ids(checkout, BRANCH, series) == final_ids(series)


def test_a_changed_file_is_still_refused_with_filters_configured(
    forked_script: RunScript, checkout: Path, filtered: Path
):
    (checkout / DECODE).write_text((checkout / DECODE).read_text() + "# local edit\n")
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.DIRTY_TREE, result.stderr
    assert DECODE in result.stderr
    assert not filtered.exists()


def test_a_split_index_leaves_no_shared_index_of_ours(forked_script: RunScript, checkout: Path):
    git(checkout, "config", "core.splitIndex", "true")
    before = sorted(p.name for p in (checkout / ".git").glob("sharedindex.*"))
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.OK, result.stderr
    assert sorted(p.name for p in (checkout / ".git").glob("sharedindex.*")) == before


# --- a ref in the way of the branch's name ---------------------------------------------


@pytest.mark.parametrize("other", ["sglang-backports", f"{BRANCH}/old"])
def test_a_ref_in_the_way_of_the_branch_is_refused_naming_branch(
    forked_script: RunScript, checkout: Path, other: str
):
    git(checkout, "branch", other)
    before, objects = repo_state(checkout), git(checkout, "count-objects", "-v")
    result = forked_script("apply-patches", "--sglang", str(checkout))
    assert result.returncode == Exit.BRANCH_EXISTS, result.stderr
    assert f"refs/heads/{other}" in result.stderr
    assert "--branch" in result.stderr.split("next step:")[1]
    assert "Traceback" not in result.stderr
    assert repo_state(checkout) == before
    assert git(checkout, "count-objects", "-v") == objects
    # the next step works
    step = result.stderr.split("--branch ", 2)[2].split(")")[0]
    again = forked_script("apply-patches", "--sglang", str(checkout), "--branch", step)
    assert again.returncode == Exit.OK, again.stderr


# --- sglang vendored in a subfolder ------------------------------------------------------


@pytest.fixture
def monorepo(tmp_path: Path, series: Series, wheel_cache: Path) -> Path:
    """A repository of the user's that holds sglang 0.5.15.post1 in third_party/sglang."""
    top = tmp_path / "mono"
    vendored = top / "third_party" / "sglang"
    vendored.mkdir(parents=True)
    (top / "README.md").write_text("our services\n")
    slim_checkout_of(wheel_cache / series.manifest.base.wheel, series.manifest.files, top, "x")
    shutil.move(top / "python", vendored / "python")
    commit_all(top, "vendor sglang 0.5.15.post1")
    git(top, "config", "user.email", "user@example.com")
    git(top, "config", "user.name", "User")
    return top


def test_sglang_vendored_in_a_subfolder_is_patched_there(
    forked_script: RunScript, monorepo: Path, series: Series
):
    vendored = monorepo / "third_party" / "sglang"
    (monorepo / "README.md").write_text("our services, being edited\n")  # not sglang's
    check = forked_script("apply-patches", "--check", "--sglang", str(vendored))
    assert check.returncode == Exit.OK, check.stderr
    result = forked_script("apply-patches", "--sglang", str(vendored))
    assert result.returncode == Exit.OK, result.stderr
    assert content_ids(monorepo, BRANCH, series, "third_party/sglang/") == final_ids(series)
    changed = git(monorepo, "diff", "--name-only", "HEAD", BRANCH).splitlines()
    base = series.manifest.blobs_at("base")
    differ = [p for p in series.manifest.files if base[p] != final_ids(series)[p]]
    assert sorted(changed) == sorted(f"third_party/sglang/{p}" for p in differ)
    again = forked_script("apply-patches", "--sglang", str(vendored))
    assert "already applied" in again.stdout, again.stderr


@pytest.mark.parametrize("given", [".", "third_party", "third_party/sglang/python"])
def test_a_folder_without_python_sglang_is_told_which_one_to_pass(
    forked_script: RunScript, monorepo: Path, series: Series, given: str
):
    vendored = monorepo / "third_party" / "sglang"
    before = repo_state(monorepo)
    result = forked_script("apply-patches", "--sglang", str(monorepo / given))
    assert result.returncode == Exit.NOT_A_CHECKOUT, result.stderr
    assert f"next step: pass --sglang {vendored}" in result.stderr
    assert repo_state(monorepo) == before
    # the advice works
    advised = forked_script("apply-patches", "--sglang", str(vendored))
    assert advised.returncode == Exit.OK, advised.stderr
