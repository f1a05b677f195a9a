"""apply-patches through git's plumbing, and the edges a hostile user found.

The run builds its commits on a temporary index and creates the branch with one
ref update; these tests check what that promises: a patch set that touches
another file is refused wherever it is applied, line endings are byte-exact, git's own reason
reaches the user under the README's code, and every printed command can be
pasted into a shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS, RunScript, SlimSet, git, repin, repo_state
from patchset import wheel
from patchset.errors import Exit
from patchset.manifest import Series
from test_apply_patches import run_as_someone_else, shared_folder  # noqa: F401 (a fixture)

BRANCH = "sglang-backports/0.5.15.post1"
# Not one of the three files the series may change; every wheel has it.
OTHER = "python/sglang/version.py"


def objects(repo: Path) -> str:
    return git(repo, "count-objects", "-v")


# --- the list of files a series may touch, enforced where it is applied ----------


def add_plain_diff_of_another_file(folder: Path, series: Series, wheel_file: Path) -> str:
    """Append a ---/+++ diff (no git header) of OTHER to the last patch; re-pin. Returns it."""
    first = wheel.read_files(wheel_file, [OTHER])[OTHER].decode().splitlines()[0]
    last = folder / series.patch_names[-1]
    text = last.read_text()
    diff = f"--- a/{OTHER}\n+++ b/{OTHER}\n@@ -1 +1,2 @@\n {first}\n+INJECTED = True\n"
    last.write_text(text + diff)
    repin(folder)
    return last.name


@pytest.fixture
def foreign_set(slim_set: SlimSet, series: Series, wheel_cache: Path) -> SlimSet:
    add_plain_diff_of_another_file(
        slim_set.folder, series, wheel_cache / series.manifest.base.wheel
    )
    return slim_set


def assert_refused_as_foreign(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert f"touches {OTHER}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_plain_diff_of_another_file_is_refused_on_a_checkout(
    forked_script: RunScript, checkout: Path, foreign_set: SlimSet
):
    before, objs = repo_state(checkout), objects(checkout)
    result = forked_script(
        "apply-patches", "--sglang", str(checkout), "--patch-set", str(foreign_set.folder)
    )
    assert_refused_as_foreign(result)
    assert repo_state(checkout) == before
    assert objects(checkout) == objs  # nothing written, not even an object


def test_a_plain_diff_of_another_file_is_refused_by_check_and_the_build_tree(
    forked_script: RunScript, tmp_path: Path, foreign_set: SlimSet
):
    patch_set = ("--patch-set", str(foreign_set.folder))
    assert_refused_as_foreign(
        forked_script("apply-patches", "--check", *patch_set, env=foreign_set.env)
    )
    assert_refused_as_foreign(forked_script("apply-patches", *patch_set, env=foreign_set.env))
    build = tmp_path / "build"
    assert not build.exists() or list(build.iterdir()) == []


def test_a_plain_diff_of_another_file_is_refused_by_build_wheel(
    forked_script: RunScript, tmp_path: Path, patch_set: Path, series: Series, wheel_cache: Path
):
    """On the real wheel, where the other file exists and the diff would apply."""
    add_plain_diff_of_another_file(patch_set, series, wheel_cache / series.manifest.base.wheel)
    out = tmp_path / "dist"
    assert_refused_as_foreign(
        forked_script("build-wheel", "--patch-set", str(patch_set), "--out", str(out))
    )
    assert not out.exists() or list(out.iterdir()) == []


def test_a_patch_that_changes_a_file_mode_is_refused(
    forked_script: RunScript, checkout: Path, slim_set: SlimSet, series: Series
):
    first = slim_set.folder / series.patch_names[0]
    path = series.manifest.files[0]
    text = first.read_text()
    header = f"diff --git a/{path} b/{path}\n"
    assert header in text
    first.write_text(text.replace(header, header + "old mode 100644\nnew mode 100755\n", 1))
    repin(slim_set.folder)
    before = repo_state(checkout)
    result = forked_script(
        "apply-patches", "--sglang", str(checkout), "--patch-set", str(slim_set.folder)
    )
    assert result.returncode == Exit.PATCHSET_INVALID, result.stderr
    assert "mode change" in result.stderr
    assert repo_state(checkout) == before


# --- line endings ---------------------------------------------------------------


def to_crlf(folder: Path, name: str) -> None:
    path = folder / name
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    repin(folder)


def test_a_crlf_patch_with_updated_hashes_fails_lint(
    forked_script: RunScript, patch_set: Path, series: Series
):
    to_crlf(patch_set, series.patch_names[0])
    result = forked_script("lint-patches", "--patch-set", str(patch_set))
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert "[line-endings]" in result.stdout + result.stderr


def test_a_crlf_patch_set_is_stale_for_export_check(
    forked_script: RunScript, slim_set: SlimSet, series: Series
):
    """As a clone made with core.autocrlf=true and no .gitattributes has it: every file CRLF."""
    patch_set = ("--patch-set", str(slim_set.folder))
    assert forked_script("apply-patches", *patch_set, env=slim_set.env).returncode == Exit.OK
    for path in slim_set.folder.iterdir():
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    result = forked_script("export-patches", "--check", *patch_set, env=slim_set.env)
    assert result.returncode == Exit.STALE, result.stdout + result.stderr
    assert "\\r" in result.stdout  # the difference is shown, made visible


def test_an_autocrlf_clone_keeps_the_commands_and_patches_byte_exact(tmp_path: Path):
    project = SCRIPTS.parent
    if subprocess.run(["git", "-C", str(project), "rev-parse"], capture_output=True).returncode:
        pytest.skip("the project is not a git checkout here")
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "-c", "core.autocrlf=true", "clone", "-q", "--no-local", str(project), str(clone)],
        check=True,
    )
    git(clone, "config", "core.autocrlf", "true")
    tracked = git(clone, "ls-files", "-z").split("\0")
    written = [p for p in tracked if p and b"\r" in (clone / p).read_bytes()]
    assert written == []
    result = subprocess.run(
        [str(clone / "scripts" / "lint-patches"), "--help"], capture_output=True
    )
    assert result.returncode == 0, result.stderr


# --- git's own reason, under the README's code -----------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repository away")
def test_a_repository_owned_by_someone_else_shows_gits_reason(
    forked_script: RunScript, tmp_path: Path, checkout: Path
):
    spaced = tmp_path / "their sglang"
    checkout.rename(spaced)
    subprocess.run(["chown", "-R", "65534:65534", str(spaced)], check=True)
    # A home of its own: no safe.directory of the machine's user applies (the run
    # removes GIT_CONFIG_GLOBAL from git's environment, so that cannot choose it).
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    for args in (["--sglang", str(spaced)], ["--check", "--sglang", str(spaced)]):
        result = forked_script("apply-patches", *args, env=env)
        assert result.returncode == Exit.ENVIRONMENT, result.stderr
        assert "dubious ownership" in result.stderr  # git's own words
        assert f"safe.directory {shlex.quote(str(spaced))}" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("part", ["objects", "refs/heads"])
def test_an_unwritable_repository_is_an_environment_error(
    shared_folder: Path,  # noqa: F811 (the fixture imported above)
    slim_template: Path,
    series: Series,
    part: str,
):
    repo = shared_folder / "sglang"
    subprocess.run(["git", "clone", "-q", str(slim_template), str(repo)], check=True)
    project = shared_folder / "project"
    for folder in ("scripts", "patches"):
        shutil.copytree(
            SCRIPTS.parent / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    home = shared_folder / "home"
    home.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "65534:65534", str(repo), str(home)], check=True)
    before = repo_state(repo) if os.geteuid() != 0 else None
    for path in [repo / ".git" / part, *(repo / ".git" / part).rglob("*")]:
        if path.is_dir():
            path.chmod(0o555)
    result = run_as_someone_else(
        [sys.executable, str(project / "scripts" / "apply-patches"), "--sglang", str(repo)],
        {"HOME": str(home), "SGLANG_BACKPORTS_CACHE": str(shared_folder / "cache")},
    )
    assert result.returncode == Exit.ENVIRONMENT, result.stdout + result.stderr
    assert "git " in result.stderr and "next step:" in result.stderr
    assert "run scripts/export-patches" not in result.stderr  # not called a bad patch
    assert "Traceback" not in result.stderr
    if before is not None:
        assert repo_state(repo) == before
    assert (
        BRANCH
        not in subprocess.run(
            ["git", "-C", str(repo), "-c", f"safe.directory={repo}", "branch", "--list"],
            capture_output=True,
            text=True,
        ).stdout
    )


# --- printed commands -------------------------------------------------------------


def test_the_printed_switch_command_can_be_pasted(
    forked_script: RunScript, tmp_path: Path, checkout: Path
):
    spaced = tmp_path / "my sglang's tree"
    checkout.rename(spaced)
    result = forked_script("apply-patches", "--sglang", str(spaced))
    assert result.returncode == Exit.OK, result.stderr
    command = result.stdout.split("`")[1]
    assert command == shlex.join(["git", "-C", str(spaced), "switch", BRANCH])
    pasted = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert pasted.returncode == 0, pasted.stderr
    assert git(spaced, "symbolic-ref", "--short", "HEAD") == BRANCH


@pytest.mark.parametrize("release", ["0.5.19", "0.5.23", "0.5.99"])
def test_a_base_that_has_the_fixes_is_refused_as_already_upstream(
    forked_script: RunScript, release: str
):
    result = forked_script("apply-patches", "--base", release)
    assert result.returncode == Exit.ALREADY_UPSTREAM, result.stderr
    assert "no patch is needed" in result.stderr


def test_a_base_no_patch_set_serves_is_still_a_mismatch(forked_script: RunScript):
    result = forked_script("apply-patches", "--base", "0.5.12")
    assert result.returncode == Exit.BASE_MISMATCH, result.stderr
    assert "nearest release served is 0.5.13" in result.stderr
