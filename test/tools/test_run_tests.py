"""scripts/run-tests: --tree, and how test/tools runs under pytest-xdist.

--tree: the step suite judges an arbitrary sglang tree as the final step. A
copy of the patched tree passes; the same copy without fix B's wait_stream
line fails, on exactly the test that guards it. Both go to one run (--tree
twice), so the worker imports torch once for the two.

test/tools runs as run-tests runs it (pytest-xdist, --dist loadgroup, this
folder's conftest as a plugin): the tests of one xdist_group share a worker,
a file without a mark is a group of its own, and every outcome the workers
report reaches the outcome file the controller writes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import treefork
from conftest import SESSION_TREES, RunScript, SlimSet, replace_text
from patchset.errors import Exit
from testrun import runner
from testrun.outcomes import EXPECTED_FAIL, FAIL, PASS, SKIP, UNEXPECTED_PASS

DECODE_PY = Path("python/sglang/srt/disaggregation/decode.py")
WAIT_LINE = "self.schedule_stream.wait_stream(self.forward_stream)"
GUARD = "test_prebuilt_batch::test_overlap_waits_for_forward_stream_between_prepare_and_process"
SELECT = "test_prebuilt_batch"


def remove_wait_line(tree: Path) -> None:
    """Replace the wait with `pass`, so the if-block stays valid Python."""
    decode = tree / DECODE_PY
    text = decode.read_text()
    lines = [line for line in text.splitlines() if line.strip() == WAIT_LINE]
    assert len(lines) == 1, f"expected one wait_stream line in {decode}, found {len(lines)}"
    replace_text(decode, text.replace(WAIT_LINE, "pass"))


def linked_copy_with_bytecode(tree: Path, dest: Path) -> Path:
    """conftest.linked_copy with tree's __pycache__ folders linked too: where an earlier run
    of the session compiled the tree (race-check's, in test_racecheck_command), the copy's
    unchanged modules load that bytecode instead of being compiled again (a link has the
    mtime and size its .pyc records); a file replace_text rewrote (a new mtime and size)
    is compiled from its new text, and a .pyc Python writes replaces the link, never
    writes through it."""
    shutil.copytree(tree / "python", dest / "python", copy_function=os.link)
    return dest


def row(output: str, test: str) -> list[str]:
    """The outcome cells of one test's row in the printed step table."""
    for line in output.splitlines():
        if line.startswith(test + " "):
            return re.split(r"\s{2,}", line[len(test) :].strip())
    raise AssertionError(f"no row for {test} in:\n{output}")


@SESSION_TREES
def test_removing_the_wait_stream_line_fails_the_suite(
    run_script: RunScript, patched_tree: Path, installed_tree: Path, tmp_path: Path
) -> None:
    """One run of the prebuilt-batch tests, three trees: the patched tree passes (itself:
    its bytecode is kept), and so does what pip installs from our wheel; a copy of it
    without the wait line fails."""
    intact = patched_tree
    broken = linked_copy_with_bytecode(patched_tree, tmp_path / "broken")
    remove_wait_line(broken)

    result = run_script(
        "run-tests", "--tree", str(intact), "--tree", str(broken),
        "--tree", str(installed_tree), "--python", sys.executable, "-k", SELECT,
    )  # fmt: skip

    assert result.returncode == Exit.TESTS_FAILED, result.stdout + result.stderr
    assert row(result.stdout, GUARD) == ["pass", "FAIL", "pass"]
    # The module still imports, and its other cases pass.
    assert row(result.stdout, "test_prebuilt_batch::test_without_overlap_nothing_waits") == [
        "pass",
        "pass",
        "pass",
    ]
    assert re.search(r"^ *tree-1: ok ", result.stdout, re.M), result.stdout
    assert re.search(r"^ *tree-3: ok ", result.stdout, re.M), result.stdout
    assert "FAILED: tree-2" in result.stdout


def test_a_folder_without_sglang_is_refused(run_script: RunScript, tmp_path: Path) -> None:
    result = run_script("run-tests", "--tree", str(tmp_path), "--python", sys.executable)

    assert result.returncode == Exit.SETUP
    assert "holds no python/sglang/__init__.py" in result.stderr


# Two files of the session-trees group, two with no mark; each test records its
# worker's pid.
GROUPED = """\
from conftest import SESSION_TREES

pytestmark = SESSION_TREES
"""
RECORD_PID = """
def test_{n}(record_property):
    record_property("pid:{name}-{n}", __import__("os").getpid())
"""
OUTCOMES = """\
import pytest


def test_passes():
    pass


@pytest.mark.xfail(strict=True, raises=AssertionError)
def test_fails_as_it_must():
    assert False


@pytest.mark.xfail(strict=True, raises=AssertionError)
def test_passes_but_must_fail():
    pass


def test_fails():
    assert False


def test_skips():
    pytest.skip("no")
"""


def test_tools_run_under_xdist_with_the_groups_and_every_outcome(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, header in (("grouped_a", GROUPED), ("grouped_b", GROUPED), ("plain_a", ""),
                         ("plain_b", "")):  # fmt: skip
        tests = "".join(RECORD_PID.format(n=n, name=name) for n in range(4))
        (suite / f"test_{name}.py").write_text(header + tests)
    (suite / "test_outcomes.py").write_text(OUTCOMES)
    out = tmp_path / "outcomes.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(runner.TOOL_TESTS), str(runner.SCRIPTS)])
    )

    # --basetemp: an xdist controller makes a numbered folder in the shared
    # /tmp/pytest-of-USER otherwise, and at its exit removes the older ones beyond
    # three, whoever left them (seen to take this test from 2 s to 120 s).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(runner.TOOL_TESTS.parent / "pytest.ini"),
         "--rootdir", str(suite), "-p", "conftest", "-p", "testrun.outcomes",
         "-n", "2", "--dist", "loadgroup", f"--outcomes-json={out}",
         f"--basetemp={tmp_path / 'basetemp'}", str(suite)],
        capture_output=True, text=True, env=env, cwd=suite,
    )  # fmt: skip

    assert result.returncode == 1, result.stdout + result.stderr  # test_fails, and the must-fail
    data = json.loads(out.read_text())
    # xdist names each test's group after an @: the mark's, or its file's.
    groups = {name.split("@")[0]: name.partition("@")[2] for name in data["outcomes"]}
    assert groups["test_grouped_b::test_3"] == "session-trees"
    assert groups["test_plain_a::test_0"] == "test_plain_a"
    assert groups["test_outcomes::test_fails"] == "test_outcomes"
    outcomes = {name.split("@")[0]: o for name, o in data["outcomes"].items()}
    assert {k: v for k, v in outcomes.items() if k.startswith("test_outcomes::")} == {
        "test_outcomes::test_passes": PASS,
        "test_outcomes::test_fails_as_it_must": EXPECTED_FAIL,
        "test_outcomes::test_passes_but_must_fail": UNEXPECTED_PASS,
        "test_outcomes::test_fails": FAIL,
        "test_outcomes::test_skips": SKIP,
    }
    assert sum(o == PASS for o in outcomes.values()) == 1 + 16
    # Each test recorded its worker's pid: a group's tests, across its files, share one.
    pids = {name.removeprefix("pid:"): pid for name, pid in data["properties"].items()}
    assert len(pids) == 16
    workers = {name: {pids[f"{name}-{n}"] for n in range(4)} for name in
               ("grouped_a", "grouped_b", "plain_a", "plain_b")}  # fmt: skip
    assert len(workers["grouped_a"] | workers["grouped_b"]) == 1, workers
    assert len(workers["plain_a"]) == 1 and len(workers["plain_b"]) == 1, workers


def test_a_signal_after_the_apply_ends_run_tests_its_worker_and_its_folder(
    slim_set: SlimSet, tmp_path: Path
) -> None:
    """SIGTERM (or Ctrl-C) to run-tests alone once it has applied a series and started
    its worker: run-tests still hears it (an apply holds the signals of its process),
    ends the worker and waits for it; nothing of its process group is left, and its
    temporary folder goes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    build = tmp_path / "build"
    env = dict(os.environ, TMPDIR=str(tmp), SGLANG_BACKPORTS_BUILD=str(build), **slim_set.env)
    proc = subprocess.Popen(
        [sys.executable, str(runner.SCRIPTS / "run-tests"), "--patch-set", str(slim_set.folder),
         "--steps-only", "--python", sys.executable],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    worker_log = build / "test-results" / "worker-1.log"
    deadline = time.monotonic() + 120
    while "importing torch" not in (worker_log.read_text() if worker_log.is_file() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == Exit.INTERRUPTED, out + err
    assert "series 0.5.15.post1: applied 0002" in out
    assert "interrupted (SIGTERM)" in err
    # run-tests led its process group, and waited for the worker: nothing of it is left.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    assert list(tmp.iterdir()) == []


def test_an_interrupted_fork_each_ends_and_waits_for_its_children(tmp_path: Path) -> None:
    """What testrun.worker and race-check do on Ctrl-C or SIGTERM."""
    ended: list[str] = []

    def child(job: str) -> int:
        (tmp_path / job).write_text(str(os.getpid()))
        time.sleep(60)
        return 0

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            treefork.fork_each(
                ["a", "b", "c"], 2, child, lambda _job: None,
                lambda job, _code, _s: ended.append(job),
            )  # fmt: skip
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30
    assert ended == [] and not (tmp_path / "c").exists()  # two at a time; none ended itself
    for job in ("a", "b"):
        with pytest.raises(ChildProcessError):  # ended, and already waited for
            os.waitpid(int((tmp_path / job).read_text()), os.WNOHANG)


def test_the_runs_temporary_files_go_to_ram_where_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RAM-backed folder with room is used unless TMPDIR names a place; else the usual
    temporary folder, which TMPDIR (or the system) names."""
    ram = tmp_path / "shm"
    ram.mkdir()
    monkeypatch.setattr(runner, "RAM_FOLDER", ram)
    monkeypatch.setattr(runner, "RAM_NEEDED", 1)  # room, whatever this machine has free now
    monkeypatch.delenv("TMPDIR", raising=False)
    assert runner.temp_parent() == ram
    monkeypatch.setattr(runner, "RAM_NEEDED", 1 << 62)  # no room
    assert runner.temp_parent() == Path(tempfile.gettempdir())
    monkeypatch.setattr(runner, "RAM_NEEDED", 1)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again, as a new process
    assert runner.temp_parent() == tmp_path
    monkeypatch.setattr(runner, "RAM_FOLDER", tmp_path / "absent")
    monkeypatch.delenv("TMPDIR")
    assert runner.temp_parent() == Path(tempfile.gettempdir())
