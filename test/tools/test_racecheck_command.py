"""scripts/race-check end to end: the step trees, wrong fixes, our installed wheel, and
H1 (the hisparse stash) clean because of a host synchronize.

The series is applied to the session's own build folder first. One run
measures every column (each run imports torch and the rest once): the series'
steps (--step all) and, as --tree columns, three wrong fixes, what pip installs
from our wheel, a copy of the patched tree whose process_batch_result_prefill
lacks the prefill result's `copy_done.synchronize()`, the unpatched base, and
three other waits (OTHER_WAITS: two wrong, one right), and a tree the scenarios
cannot drive (its table is missing; the others' are all shown).
A given tree is reported as it is ("races open in this tree"), compared with
the column of the step its files hold, and with nothing where they hold none.
The steps are clean on H1; that copy races exactly
where the [writers] table says the synchronize orders: the forward stream's
relay write into the request's row and _build_hisparse_decode_batch's stash
from the schedule stream. So the clean cell of [races.H1] is the
synchronize's doing, not a path the scenario failed to take.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from commands import race_check as cli
from conftest import SCRIPTS, SESSION_TREES, linked_copy, repin, replace_text
from patchset.manifest import Series
from patchset.plays import BY_NAME, PLAYS, SCENARIOS
from racecheck import report, writers

pytestmark = SESSION_TREES

# The ordering patch 0002 adds to get_new_prebuilt_batch.
WAIT = "            self.schedule_stream.wait_stream(self.forward_stream)\n"
IF_OVERLAP = "        if self.enable_overlap:\n"
EAGLE = {play.name for play in PLAYS if play.spec}
DECODE = Path("python", "sglang", "srt", "disaggregation", "decode.py")
PROCESSOR = Path(
    "python", "sglang", "srt", "managers", "scheduler_components", "batch_result_processor.py"
)
# The host synchronize at the top of process_batch_result_prefill's generation branch.
SYNCHRONIZE = (
    "        if self.is_generation:\n"
    "            if result.copy_done is not None:\n"
    "                result.copy_done.synchronize()\n"
)
# Other waits in place of 0002's, in the order of their columns after the six above: a wait
# on the scheduler's first admission only (a server keeps one scheduler), an event recorded
# on the schedule stream itself, and the right event, through torch.cuda as a fork may write
# them.
OTHER_WAITS = {
    "first-only": (
        "            if not getattr(self, 'waited_once', False):\n"
        "                self.waited_once = True\n" + WAIT.replace("    ", "        ", 1)
    ),
    "own-event": (
        "            done = torch.cuda.Event()\n"
        "            done.record()\n"
        "            self.schedule_stream.wait_event(done)\n"
    ),
    "forward-event": (
        "            done = torch.cuda.Event()\n"
        "            done.record(self.forward_stream)\n"
        "            self.schedule_stream.wait_event(done)\n"
    ),
}
# In place of 0002's wait: a tree whose decode path fails whenever a scenario drives it.
BROKEN = "            raise RuntimeError('a path the scenarios cannot drive')\n"
HISPARSE_STASH = "srt/managers/scheduler.py Scheduler._build_hisparse_decode_batch stash"


def race_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "race-check"), *args], capture_output=True, text=True
    )


def sections(out: str) -> dict[str, str]:
    """The race reports of each column ('base', 'tree 2', ...), by column."""
    found: dict[str, str] = {}
    for block in out.split("\n\n"):
        match = re.match(r"(\S[^\n]*?): (?:\d+ races?|no race)", block)
        if match:
            found[match.group(1)] = block
    return found


def raced(section: str) -> set[str]:
    """'S5 3' for every '[S5] output_tokens_buf row 3: ...' line of a section."""
    return {f"{s} {r}" for s, r in re.findall(r"^\[(\w+)\] \w+ row (\d+):", section, re.M)}


def edited_copy(patched_tree: Path, folder: Path, path: Path, old: str, new: str) -> Path:
    """A copy of the patched tree (hard links) whose file path has `old`, found there
    exactly once, replaced by `new`."""
    linked_copy(patched_tree, folder)
    edited = folder / path
    source = edited.read_text()
    assert source.count(old) == 1, f"{old!r} is not once in {path}: the code moved"
    replace_text(edited, source.replace(old, new))
    return folder


def wrong_fix(patched_tree: Path, folder: Path, condition: str | None) -> Path:
    """A copy of the patched tree whose wait runs only when condition holds (None: never)."""
    source = (patched_tree / DECODE).read_text()
    assert source.count(IF_OVERLAP + "            # A request") == 1, "0002's wait moved"
    assert source.count(WAIT) == 1, "patch 0002's wait_stream is not where this test expects it"
    if condition is None:
        return edited_copy(patched_tree, folder, DECODE, WAIT, "            pass\n")
    return edited_copy(
        patched_tree,
        folder,
        DECODE,
        IF_OVERLAP + "            # A request",
        f"        if self.enable_overlap and {condition}:\n            # A request",
    )


def without_synchronize(patched_tree: Path, folder: Path) -> Path:
    """A copy of the patched tree whose prefill result processing never waits for copy_done."""
    return edited_copy(
        patched_tree, folder, PROCESSOR, SYNCHRONIZE, "        if self.is_generation:\n"
    )


@pytest.fixture(scope="module")
def checked(
    session_step_trees: dict[str, Path],
    patched_tree: Path,
    installed_tree: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    """One race-check run over every step and six trees; (its result, the trees)."""
    folder = tmp_path_factory.mktemp("wrong-fixes")
    trees = [
        wrong_fix(patched_tree, folder / "no-wait", None),
        wrong_fix(patched_tree, folder / "one-request", "len(can_run_list) == 1"),
        wrong_fix(patched_tree, folder / "spec-only", "not self.spec_algorithm.is_none()"),
        installed_tree,
        without_synchronize(patched_tree, folder / "no-sync"),
        session_step_trees["base"],
        *(
            edited_copy(patched_tree, folder / name, DECODE, WAIT, wait)
            for name, wait in OTHER_WAITS.items()
        ),
        edited_copy(patched_tree, folder / "broken", DECODE, WAIT, BROKEN),
    ]
    return race_check("--step", "all", *(a for tree in trees for a in ("--tree", str(tree)))), trees


def test_every_step_gives_the_expected_table(
    series: Series, checked: tuple[subprocess.CompletedProcess[str], list[Path]]
) -> None:
    result, _trees = checked
    out = result.stdout
    assert "ok: the measured table is the expected one" in out, out + result.stderr
    for step in series.manifest.steps:
        label = step if step == "base" else f"+{step}"
        assert f"race-check: {len(SCENARIOS)} scenarios on {label} (" in out
    reports = sections(out)
    final = "+" + series.manifest.final_step
    assert reports[final].startswith(f"{final}: no race")
    # Each race by row: only rows the in-flight forward wrote and the batch reuses.
    assert raced(reports["base"]) >= {"S1 3", "S2 2", "S3 4", "S5 3", "S5 5", "S9 2", "S9 6"}
    assert not {r for r in raced(reports["base"]) if r.startswith(("S10 ", "S11 "))}
    assert "sglang/srt/disaggregation/decode.py:" in out
    assert "WAR barrier " in out and "ran on torch " in out
    assert "timings:" in out


def test_waits_that_depend_on_the_batch_turn_their_cells_red(
    checked: tuple[subprocess.CompletedProcess[str], list[Path]],
) -> None:
    result, trees = checked
    assert result.returncode == 15, result.stdout + result.stderr
    out = result.stdout
    reports = sections(out)
    # 0002 restores the base FutureMap, so without its wait S2 reopens too: base's 48.
    assert f"races open in this tree {trees[0]}: 48 (" in out
    assert "output_tokens_buf row 4: unordered writes" in reports["tree 1"]
    assert "write on forward_stream" in out and "write on schedule_stream" in out
    # A wait only for one-request batches: every multi-request shape is red, by row.
    one = raced(reports["tree 2"])
    assert {"S4 3", "S4 5", "S5 3", "S5 5", "S7 3", "S8 2", "S8 6", "S9 6", "L4 3"} <= one
    assert not {r for r in one if r.split()[0] in ("S1", "S2", "S3", "S10", "S11")}
    # A wait only on the EAGLE path: every non-speculative shape is red.
    spec = raced(reports["tree 3"])
    assert {"S3 4", "S5 3", "S5 5", "S7 3", "S9 2", "S9 6", "L2 3", "L4 3"} <= spec
    assert not {r for r in spec if r.split()[0] in EAGLE}


def test_a_wait_on_the_first_admission_only_or_on_the_wrong_event_is_red(
    checked: tuple[subprocess.CompletedProcess[str], list[Path]],
) -> None:
    """The columns of OTHER_WAITS: the first two as red as no wait at all (the scenarios'
    scheduler has admitted a batch before), the right event clean."""
    result, trees = checked
    out = result.stdout
    reports = sections(out)
    no_wait = raced(reports.get("tree 1", ""))
    assert no_wait, out
    first_only, own_event = (raced(reports.get(f"tree {n}", "")) for n in (7, 8))
    assert first_only == no_wait, reports.get("tree 7", out)
    assert own_event == no_wait, reports.get("tree 8", out)
    assert reports.get("tree 9", "").startswith("tree 9: no race"), out
    assert f"ok: no race in this tree {trees[8]}" in out


def test_a_tree_that_cannot_run_is_named_after_every_other_trees_table(
    checked: tuple[subprocess.CompletedProcess[str], list[Path]],
) -> None:
    """The last tree fails in every scenario: the error names it alone, after the nine
    other trees' reports and verdicts; the races found elsewhere keep exit 15."""
    result, trees = checked
    assert result.returncode == 15, result.stdout + result.stderr
    assert f"tree 10 ({trees[9]}): scenario " in result.stderr, result.stderr
    assert "could not run: RuntimeError: a path the scenarios cannot drive" in result.stderr
    assert result.stderr.count("could not run") == 1, result.stderr  # no other tree's
    assert "(the other trees' tables are above)" in result.stderr
    reports = sections(result.stdout)
    assert [f"tree {n}" in reports for n in range(1, 11)] == [True] * 9 + [False], reports
    assert f"ok: no race in this tree {trees[8]}" in result.stdout
    assert f"this tree {trees[9]}" not in result.stdout  # no verdict on it


def test_what_pip_installs_from_our_wheel_has_no_race(
    checked: tuple[subprocess.CompletedProcess[str], list[Path]],
) -> None:
    result, trees = checked
    assert sections(result.stdout)["tree 4"].startswith("tree 4: no race"), result.stdout
    assert f"ok: no race in this tree {trees[3]}\n  the series' files in it are step +0002" in (
        result.stdout
    )


def test_a_given_tree_is_reported_as_it_is(
    series: Series, checked: tuple[subprocess.CompletedProcess[str], list[Path]]
) -> None:
    """An unpatched tree: its races, as its step expects them; a wrong fix: no expectation."""
    result, trees = checked
    out = result.stdout
    base = sections(out)["tree 6"]
    assert raced(base) and raced(base) == raced(sections(out)["base"]), base
    version = series.manifest.base.version
    assert f"races open in this tree {trees[5]}: " in out
    assert (
        f"  the series' files in it are step base of sglang {version}'s series, as its "
        "[races] table expects"
    ) in out
    for tree in trees[:3]:
        assert f"races open in this tree {tree}: " in out
    wrong = 3 + len(OTHER_WAITS)
    assert out.count(f"  the series' files in it match no step of sglang {version}'s") == wrong
    # No cell of a given tree is held against a step it does not hold: only the copy
    # without the synchronize, whose series files are step 0002's, is (H1).
    assert out.count("[EXPECTED: clean]") == 1
    assert "patched tree" not in out


def test_a_tree_is_judged_by_the_step_its_files_hold(
    patch_set: Path, patched_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a third patch in the manifest that changes no file, the patched tree holds 0003."""
    pin = patch_set / "pin.toml"
    text = pin.read_text()
    fake = "0003-a-fake-third-step.patch"
    text = text.replace("[patches]\n", f'[patches]\n"{fake}" = "{"0" * 64}"\n', 1)
    text = text.replace(
        '"0002" = []\n',
        '"0002" = [{ kind = "write/write", rows = [7], '
        'buffers = ["output_tokens_buf"] }]\n"0003" = []\n',
    )
    # the third step holds what the second does and changes no file
    text = re.sub(r'("0002" = ("[0-9a-f]{40}") })', r'"0002" = \2, "0003" = \2 }', text)
    text = text.replace('"0002" = ["fix-b"]\n', '"0002" = ["fix-b"]\n"0003" = ["fix-b"]\n')
    # The fake step goes last in series order.
    lines = text.splitlines()
    start = lines.index("[patches]") + 1
    lines[start : start + 3] = [*lines[start + 1 : start + 3], lines[start]]
    pin.write_text("\n".join(lines) + "\n")
    (patch_set / "series").write_text((patch_set / "series").read_text() + fake + "\n")
    repin(patch_set)
    # The columns race-check would measure, and its verdict on a tree without races
    # (the measuring itself is the run above).
    runs = cli.plan_runs([Series.load(patch_set)], None, [patched_tree])
    assert [(r.label, r.step, r.given) for r in runs] == [("tree", "0003", True)]
    runs[0].races = {name: [] for name in SCENARIOS}
    assert report.verdict(runs) == 0
    assert f"ok: no race in this tree {patched_tree}" in capsys.readouterr().out
    # Judged by the 0002 column instead, the same tree would be a differing table.
    runs[0].step = "0002"
    assert report.verdict(runs) == 15
    assert "expects otherwise in: S1" in capsys.readouterr().out
    helped = race_check("--patch-set", str(patch_set), "--help")
    assert "{base,0001,0002,0003,all}" in helped.stdout


# --- H1, the hisparse stash ---------------------------------------------------------


def test_h1_is_clean_on_every_step(
    series: Series, checked: tuple[subprocess.CompletedProcess[str], list[Path]]
) -> None:
    result, _trees = checked
    out = result.stdout
    assert "ok: the measured table is the expected one" in out, out + result.stderr
    row = next(line for line in out.splitlines() if line.startswith("H1 "))
    assert row.split()[1 : 1 + len(series.manifest.steps)] == ["clean"] * len(series.manifest.steps)
    assert all(not cells for cells in series.manifest.races["H1"].values())


def test_h1_races_without_the_prefill_results_synchronize(
    checked: tuple[subprocess.CompletedProcess[str], list[Path]],
) -> None:
    result, trees = checked
    out, tree = result.stdout, trees[4]
    assert result.returncode == 15, out + result.stderr
    assert f"races open in this tree {tree}: 1 (H1)\n  FAILED: the series' files in it are " in out
    assert "[races] table expects otherwise in: H1" in out
    # The copy's block of races: "tree 5: N race(s) (...)" up to the blank line after it.
    block = sections(out)["tree 5"]
    assert block.startswith(f"tree 5: 1 race ({tree})"), block
    lines = block.splitlines()
    assert lines[1] == "[H1] output_tokens_buf row 3: unordered writes", block
    assert "first : write on forward_stream" in lines[2]
    assert "second: write on schedule_stream" in block
    assert "in _build_hisparse_decode_batch" in block
    # Only H1 depends on it: every other scenario is as clean as on the patched tree.
    assert [line for line in lines if line.startswith("[")] == [lines[1]]


def test_the_writers_table_names_h1_for_the_hisparse_stash(series: Series) -> None:
    entry = writers.classification(series.manifest)[HISPARSE_STASH]
    assert entry["scenarios"] == "H1"
    assert "copy_done.synchronize()" in entry["order"]
    assert BY_NAME["H1"].hisparse and BY_NAME["H1"].title == "hisparse stash"
