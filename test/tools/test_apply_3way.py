"""apply-patches --sglang PATH --3way: the series merged onto a fork of a served release.

Every fork here is a user's checkout of 0.5.15.post1's real files (the `checkout`
fixture) with a change of its own committed on top. What --3way promises: the
branch is made only from a clean merge whose files are judged fixed by their
code shape; otherwise exit 10, and the user's branch, index, work tree, refs and
TMPDIR are as they were. A signal at any git call leaves nothing of ours.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import SCRIPTS, RunScript, commit_all, git, repo_state
from patchset import shape, wheel
from patchset.errors import Exit
from patchset.manifest import Series
from patchset.shapeflow import Sources
from test_apply_interrupt import assert_nothing_of_ours, faulty_git, run_with_fault  # noqa: F401

BRANCH = "sglang-backports/0.5.15.post1"
DECODE = "python/sglang/srt/disaggregation/decode.py"
COMMENT = "# our fork: the decode server of the team\n"
PROCESS = "        new_batch.process_prebuilt(self.server_args, self.future_map)\n"
# Patch 0002's context before the wait it adds, and the first line it adds.
CONTEXT = "        # construct fake completed prefill\n"
PREPARE = "        new_batch.prepare_for_prebuilt()\n"
IF_OVERLAP = "        if self.enable_overlap:\n"
BUILT = "            self.spec_algorithm,\n        )\n"
# A fork's own fast path: it seeds the prebuilt rows without any ordering after the
# in-flight forward, on a path that patch 0002 does not touch.
FAST_PATH = (
    "        if self.server_args.disaggregation_decode_fast_prebuilt:\n"
    "            new_batch.prepare_for_prebuilt()\n"
    "            new_batch.process_prebuilt(self.server_args, self.future_map)\n"
    "            return new_batch\n"
)


def fork(repo: Path, old: str, new: str) -> Path:
    """Commit a change of the fork's own to decode.py (old must occur once)."""
    path = repo / DECODE
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    commit_all(repo, "our fork's change")
    return repo


@pytest.fixture
def runs_tmpdir(tmp_path: Path) -> Path:
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


def untouched(repo: Path) -> tuple[dict[str, str], bytes, str]:
    """What the user has: refs, HEAD, status, worktrees, the index's bytes, the config."""
    state = repo_state(repo)  # git status may refresh the index: read it after
    return state, (repo / ".git" / "index").read_bytes(), (repo / ".git" / "config").read_text()


def branch_files(repo: Path, series: Series) -> dict[str, str]:
    return {path: git(repo, "show", f"{BRANCH}:{path}") + "\n" for path in series.manifest.files}


def test_a_fork_is_refused_without_3way_and_told_it_exists(
    forked_script: RunScript, checkout: Path
) -> None:
    repo = fork(checkout, "from __future__", COMMENT + "from __future__")
    before = untouched(repo)
    result = forked_script("apply-patches", "--sglang", str(repo))
    assert result.returncode == Exit.BASE_MISMATCH, result.stderr
    assert "the nearest is sglang 0.5.15.post1" in result.stderr
    assert f"apply-patches --sglang {repo} --3way" in result.stderr
    assert untouched(repo) == before


def test_3way_merges_the_series_onto_a_fork_and_changes_nothing_else(
    run_script: RunScript,
    forked_script: RunScript,
    checkout: Path,
    series: Series,
    runs_tmpdir: Path,
) -> None:
    """The first run started as a user starts it; the second, a no-op, forked."""
    repo = fork(checkout, "from __future__", COMMENT + "from __future__")
    head = git(repo, "rev-parse", "HEAD")
    before = untouched(repo)
    env = {"TMPDIR": str(runs_tmpdir)}
    result = run_script("apply-patches", "--sglang", str(repo), "--3way", env=env)
    assert result.returncode == Exit.OK, result.stderr
    index, config = (repo / ".git" / "index").read_bytes(), (repo / ".git" / "config").read_text()
    state = repo_state(repo)
    assert (state["head"], state["status"], state["worktrees"]) == (
        before[0]["head"],
        before[0]["status"],
        before[0]["worktrees"],
    )
    assert (index, config) == before[1:]
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "rev-parse", f"{BRANCH}~{len(series.patch_names)}") == head
    made = f"refs/heads/{BRANCH} {git(repo, 'rev-parse', BRANCH)}"
    assert sorted(state["refs"].splitlines()) == sorted([*before[0]["refs"].splitlines(), made])
    merged = branch_files(repo, series)
    assert COMMENT in merged[DECODE]  # the fork's own change is kept
    judged = shape.judge(Sources.from_texts(merged))
    assert judged.verdict == shape.FIXED, judged.lines()
    assert "judged by code shape: fixed" in result.stdout
    assert f"scripts/race-check --tree {repo}" in result.stdout
    assert sorted(runs_tmpdir.iterdir()) == []
    again = forked_script("apply-patches", "--sglang", str(repo), "--3way", env=env)
    assert again.returncode == Exit.OK and "already applied" in again.stdout, again.stderr


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_3way_merges_where_the_plain_apply_cannot(
    forked_script: RunScript, tmp_path: Path, series: Series, wheel_cache: Path, object_format: str
) -> None:
    """The fork changed a context line of patch 0002: only the merge applies it. In a
    sha256 repository the patches' preimages are found by their sha256 ids."""
    repo = tmp_path / "sglang"
    repo.mkdir()
    git(repo, "init", "-q", f"--object-format={object_format}")
    wheel_file = wheel_cache / series.manifest.base.wheel
    for path, data in wheel.read_files(wheel_file, series.manifest.files).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    commit_all(repo, "v0.5.15.post1")
    fork(repo, CONTEXT, CONTEXT.replace("prefill", "prefill (our fork)"))
    result = forked_script("apply-patches", "--sglang", str(repo), "--3way")
    assert result.returncode == Exit.OK, result.stderr
    merged = branch_files(repo, series)
    assert CONTEXT.replace("prefill", "prefill (our fork)") + PREPARE + IF_OVERLAP in merged[DECODE]
    assert shape.judge(Sources.from_texts(merged)).fixed
    touched = result.stdout.split("touch these functions the series changes:")[1]
    assert "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch" in touched


def test_a_conflict_with_patch_0002_changes_nothing_and_names_the_function(
    forked_script: RunScript, checkout: Path, runs_tmpdir: Path
) -> None:
    repo = fork(checkout, PROCESS, PROCESS.replace(")\n", ")  # seeded at once\n"))
    before = untouched(repo)
    result = forked_script(
        "apply-patches", "--sglang", str(repo), "--3way", env={"TMPDIR": str(runs_tmpdir)}
    )
    assert result.returncode == Exit.APPLY_FAILED, result.stdout + result.stderr
    assert "patch 0002-" in result.stderr and f"conflicts in {DECODE}" in result.stderr
    touched = result.stderr.split("touch these functions the series changes:")[1]
    assert f"{DECODE} SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch" in touched
    assert "Traceback" not in result.stderr
    assert untouched(repo) == before
    assert sorted(runs_tmpdir.iterdir()) == []


def test_a_clean_merge_that_is_not_judged_fixed_is_refused(
    forked_script: RunScript, checkout: Path, runs_tmpdir: Path
) -> None:
    repo = fork(checkout, BUILT, BUILT + FAST_PATH)
    before = untouched(repo)
    result = forked_script(
        "apply-patches", "--sglang", str(repo), "--3way", env={"TMPDIR": str(runs_tmpdir)}
    )
    assert result.returncode == Exit.APPLY_FAILED, result.stdout + result.stderr
    assert "merged onto" in result.stderr and "not judged fixed" in result.stderr
    assert "affected: " in result.stderr  # the judgement, with its reason and evidence
    assert "get_new_prebuilt_batch" in result.stderr.split("touch these functions")[1]
    assert untouched(repo) == before
    assert sorted(runs_tmpdir.iterdir()) == []


def test_a_fork_of_every_file_needs_base_to_name_its_release(
    forked_script: RunScript, checkout: Path, series: Series
) -> None:
    for path in series.manifest.files:
        (checkout / path).write_text(COMMENT + (checkout / path).read_text())
    commit_all(checkout, "our fork's header in every file")
    before = untouched(checkout)
    unnamed = forked_script("apply-patches", "--sglang", str(checkout), "--3way")
    assert unnamed.returncode == Exit.BASE_MISMATCH, unnamed.stdout + unnamed.stderr
    assert "shares no file with a served release" in unnamed.stderr
    assert "add --base VERSION" in unnamed.stderr
    assert untouched(checkout) == before
    named = forked_script(
        "apply-patches", "--sglang", str(checkout), "--3way", "--base", "0.5.15.post1"
    )
    assert named.returncode == Exit.OK, named.stderr
    assert shape.judge(Sources.from_texts(branch_files(checkout, series))).fixed


def test_a_merge_driver_of_the_users_is_not_run(
    forked_script: RunScript, checkout: Path, tmp_path: Path
) -> None:
    """A driver that would take the patch's side: run, it would merge cleanly."""
    ran = tmp_path / "driver-ran"
    (checkout / ".gitattributes").write_text("*.py merge=ours-too\n")
    git(checkout, "config", "merge.ours-too.driver", f"touch {ran}; cp %B %A")
    repo = fork(checkout, CONTEXT, CONTEXT.replace("prefill", "prefill (our fork)"))
    before = untouched(repo)
    result = forked_script("apply-patches", "--sglang", str(repo), "--3way")
    assert result.returncode == Exit.APPLY_FAILED, result.stdout + result.stderr
    assert "merge drivers your git configuration names, ours-too, are not run" in result.stderr
    assert not ran.exists()
    assert untouched(repo) == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--3way"], "--3way is for a fork: it needs --sglang PATH"),
        (["--3way", "--check", "--sglang", "."], "--3way cannot be combined with --check"),
    ],
    ids=["without-sglang", "with-check"],
)
def test_3way_is_refused_where_it_means_nothing(tmp_path: Path, args: list[str], said: str) -> None:
    result = SERVER.run(SCRIPTS / "apply-patches", args, cwd=tmp_path)
    assert result.returncode == Exit.USAGE, result.stderr
    assert said in result.stderr


def test_3way_on_a_fork_survives_sigint_at_each_git_call(
    forked_script: RunScript,
    faulty_git: Path,  # noqa: F811 (the fixture)
    checkout: Path,
    runs_tmpdir: Path,
    series: Series,
) -> None:
    repo = fork(checkout, "from __future__", COMMENT + "from __future__")
    before = untouched(repo)
    env = {"TMPDIR": str(runs_tmpdir)}
    (faulty_git / "count.log").touch()  # a run that makes no git call fails below, not here
    at = 1
    while True:
        code, stderr, calls = run_with_fault(
            forked_script, faulty_git, "INT", at, "--sglang", str(repo), "--3way", env=env
        )
        assert_nothing_of_ours(repo, runs_tmpdir)
        if calls < at:
            assert code == Exit.OK, stderr
            break
        if git(repo, "for-each-ref", f"refs/heads/{BRANCH}"):
            assert code == Exit.OK, (at, stderr)  # the branch made: the run has succeeded
            git(repo, "branch", "-D", BRANCH)
        else:
            assert code == Exit.INTERRUPTED, (at, stderr)
        assert untouched(repo) == before, at
        at += 1
    assert at > 10  # the loop went through the run's git calls
    assert shape.judge(Sources.from_texts(branch_files(repo, series))).fixed
    assert os.listdir(runs_tmpdir) == []
