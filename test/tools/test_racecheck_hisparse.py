"""H1, the hisparse stash, end to end: clean because of a host synchronize.

scripts/race-check plays H1 on the series' steps and on a copy of the
patched tree whose process_batch_result_prefill lacks the prefill result's
`copy_done.synchronize()`. The steps are clean; the copy races exactly where
the [writers] table says the synchronize orders: the forward stream's relay
write into the request's row and _build_hisparse_decode_batch's stash from
the schedule stream. So the clean cell of [races.H1] is the synchronize's
doing, not a path the scenario failed to take.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS, linked_copy, replace_text
from patchset.manifest import Series
from racecheck import writers
from racecheck.catalogue import BY_NAME

PROCESSOR = Path(
    "python", "sglang", "srt", "managers", "scheduler_components", "batch_result_processor.py"
)
# The host synchronize at the top of process_batch_result_prefill's generation branch.
SYNCHRONIZE = (
    "        if self.is_generation:\n"
    "            if result.copy_done is not None:\n"
    "                result.copy_done.synchronize()\n"
)
HISPARSE_STASH = "srt/managers/scheduler.py Scheduler._build_hisparse_decode_batch stash"


def without_synchronize(patched_tree: Path, folder: Path) -> Path:
    """A copy of the patched tree whose prefill result processing never waits for copy_done."""
    linked_copy(patched_tree, folder)
    processor = folder / PROCESSOR
    source = processor.read_text()
    assert source.count(SYNCHRONIZE) == 1, "the prefill result's synchronize moved"
    replace_text(processor, source.replace(SYNCHRONIZE, "        if self.is_generation:\n"))
    return folder


@pytest.fixture(scope="module")
def checked(
    patched_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One race-check run: every step, and the tree without the synchronize."""
    tree = without_synchronize(patched_tree, tmp_path_factory.mktemp("hisparse") / "no-sync")
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "race-check"), "--step", "all", "--tree", str(tree)],
        capture_output=True,
        text=True,
    )
    return result, tree


def test_h1_is_clean_on_every_step(
    series: Series, checked: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    result, _tree = checked
    out = result.stdout
    assert "ok: the measured table is the expected one" in out, out + result.stderr
    row = next(line for line in out.splitlines() if line.startswith("H1 "))
    assert row.split()[1 : 1 + len(series.manifest.steps)] == ["clean"] * len(series.manifest.steps)
    assert all(not cells for cells in series.manifest.races["H1"].values())


def test_h1_races_without_the_prefill_results_synchronize(
    checked: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, tree = checked
    out = result.stdout
    assert result.returncode == 15, out + result.stderr
    assert f"FAILED: 1 race(s) in the patched tree {tree}" in out
    # The copy's block of races: "tree: N race(s) (...)" up to the blank line after it.
    block = out[out.index(f"tree: 1 race ({tree})") :].split("\n\n", 1)[0]
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
