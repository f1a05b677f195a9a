"""scripts/run-tests --tree: the step suite judges an arbitrary sglang tree as the final step.

A copy of the patched tree passes; the same copy without fix B's wait_stream
line fails, on exactly the test that guards it. Both go to one run (--tree
twice), so the worker imports torch once for the two.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conftest import RunScript, linked_copy, replace_text
from patchset.errors import Exit
from testrun import runner

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


def row(output: str, test: str) -> list[str]:
    """The outcome cells of one test's row in the printed step table."""
    for line in output.splitlines():
        if line.startswith(test + " "):
            return re.split(r"\s{2,}", line[len(test) :].strip())
    raise AssertionError(f"no row for {test} in:\n{output}")


def test_removing_the_wait_stream_line_fails_the_suite(
    run_script: RunScript, patched_tree: Path, tmp_path: Path
) -> None:
    """One run, two trees: the patched copy passes; without the wait line it fails."""
    intact = linked_copy(patched_tree, tmp_path / "intact")
    broken = linked_copy(patched_tree, tmp_path / "broken")
    remove_wait_line(broken)

    result = run_script(
        "run-tests", "--tree", str(intact), "--tree", str(broken),
        "--python", sys.executable, "-k", SELECT,
    )  # fmt: skip

    assert result.returncode == Exit.TESTS_FAILED, result.stdout + result.stderr
    assert row(result.stdout, GUARD) == ["pass", "FAIL"]
    # Only the guard fails: the module still imports and the other cases pass.
    assert row(result.stdout, "test_prebuilt_batch::test_without_overlap_nothing_waits") == [
        "pass",
        "pass",
    ]
    assert re.search(r"^ *tree-1: ok ", result.stdout, re.M), result.stdout
    assert "FAILED: tree-2" in result.stdout


def test_a_folder_without_sglang_is_refused(run_script: RunScript, tmp_path: Path) -> None:
    result = run_script("run-tests", "--tree", str(tmp_path), "--python", sys.executable)

    assert result.returncode == Exit.SETUP
    assert "holds no python/sglang/__init__.py" in result.stderr


def tool_files() -> tuple[list[Path], list[Path]]:
    """test/tools' files, and those of them in no TOGETHER group (a piece may hold one alone)."""
    files = sorted(runner.TOOL_TESTS.glob("test_*.py"))
    grouped = {stem for group in runner.TOGETHER for stem in group}
    return files, [f for f in files if f.stem not in grouped]


def test_a_fresh_checkout_shares_the_tools_out_by_the_times_kept_on_this_machine(
    tmp_path: Path,
) -> None:
    """No times of its own (a fresh clone): the times kept in the cache folder decide."""
    files, alone = tool_files()
    heavy = alone[0]
    kept = tmp_path / "cache" / "tools-seconds.json"
    kept.parent.mkdir()
    kept.write_text(json.dumps({f.stem: 1000.0 if f == heavy else 1.0 for f in files}))
    results = tmp_path / "results"
    results.mkdir()

    pieces = runner.tool_pieces(results, 2, kept)

    # The heavy file weighs more than all the others: it is a piece on its own.
    assert [heavy] in [piece.tests for piece in pieces]
    assert sorted(f for piece in pieces for f in piece.tests) == files


def test_this_checkouts_own_times_come_first_and_are_kept_for_the_next_clone(
    tmp_path: Path,
) -> None:
    files, alone = tool_files()
    heavy = alone[-1]
    results = tmp_path / "results"
    results.mkdir()
    cases = "".join(
        f'<testcase classname="tools.{f.stem}" name="t" time="{900 if f == heavy else 2}"/>'
        for f in files
    )
    (results / "tools-1.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    kept = tmp_path / "cache" / "tools-seconds.json"
    kept.parent.mkdir()
    kept.write_text(json.dumps({f.stem: 1.0 for f in files}))

    assert [heavy] in [piece.tests for piece in runner.tool_pieces(results, 2, kept)]
    runner.keep_tool_seconds(results, kept)
    assert json.loads(kept.read_text())[heavy.stem] == 900.0
    assert list(kept.parent.iterdir()) == [kept]  # no partial file left
