"""race-check --write-expected / --check-expected: the [races] tables follow a run.

The run itself is every step run of scripts/run-tests (test/steps/
test_race_scenarios.py asserts each cell); here the measured races are given, so each test
takes milliseconds: what is written, what is refused, and that a table
written from the run that measured it is the committed one byte for byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from commands import race_check as cli
from patchset import paths
from patchset.errors import BackportError, Exit
from patchset.manifest import Series, patch_set_folders
from patchset.plays import SCENARIOS
from racecheck import report
from racecheck.report import Access, Race


def races_of(cell: report.Cell) -> list[Race]:
    """Races whose cell is the given one (the code sites do not matter to a table)."""
    out = []
    for kind, buffer, row in sorted(cell):
        first, second = kind.split("/")
        out.append(
            Race(
                buffer,
                row,
                Access(first, "forward_stream", "op", (), ()),
                Access(second, "schedule_stream", "op", (), ()),
            )
        )
    return out


def measured_runs(series: Series, table: report.Table) -> list[report.TreeRun]:
    """The columns of one base as a run that measured table would fill them."""
    manifest = series.manifest
    runs = []
    for step in manifest.steps:
        run = report.TreeRun(step, step, series.folder, table, manifest.final_step)
        run.races = {name: races_of(table[name][step]) for name in SCENARIOS}
        runs.append(run)
    return runs


def committed_table(series: Series) -> report.Table:
    return report.expected_table(series.manifest, SCENARIOS)


@pytest.mark.parametrize(
    "folder", patch_set_folders(paths.PATCHES_ROOT), ids=lambda f: f.name.removeprefix("sglang-")
)
def test_writing_the_committed_tables_changes_no_byte(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    series = Series.load(copy)
    runs = measured_runs(series, committed_table(series))
    assert cli.expected_tables([series], runs, write=True) == Exit.OK
    assert (copy / "pin.toml").read_bytes() == (folder / "pin.toml").read_bytes()


def test_a_stale_table_is_exit_13_and_write_restores_it(patch_set: Path) -> None:
    pin = patch_set / "pin.toml"
    original = pin.read_text(encoding="utf-8")
    measured = committed_table(Series.load(patch_set))
    start = original.index("[races.S3]\nbase = ")
    end = original.index("\n", start + len("[races.S3]\n"))
    pin.write_text(original[:start] + "[races.S3]\nbase = []" + original[end:], encoding="utf-8")
    stale = Series.load(patch_set)
    assert stale.manifest.races["S3"]["base"] == ()
    with pytest.raises(BackportError, match=r"not what the run measured") as raised:
        cli.expected_tables([stale], measured_runs(stale, measured), write=False)
    assert raised.value.code == Exit.STALE
    assert "--write-expected" in raised.value.next_step
    assert pin.read_text(encoding="utf-8") != original  # --check-expected writes nothing
    assert cli.expected_tables([stale], measured_runs(stale, measured), write=True) == Exit.OK
    assert pin.read_text(encoding="utf-8") == original


def test_a_manifest_without_race_tables_gets_them_written(patch_set: Path) -> None:
    pin = patch_set / "pin.toml"
    original = pin.read_text(encoding="utf-8")
    measured = committed_table(Series.load(patch_set))
    pin.write_text(original[: original.index("[races.S1]")], encoding="utf-8")
    bare = Series.load(patch_set)
    assert bare.manifest.races == {}
    assert cli.expected_tables([bare], measured_runs(bare, measured), write=True) == Exit.OK
    assert committed_table(Series.load(patch_set)) == measured
    assert pin.read_text(encoding="utf-8").endswith(original[original.index("[races.S1]") :])


def test_a_final_step_with_a_race_is_never_written(
    patch_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong fix must not become the expected table: nothing is written, exit 15."""
    pin = patch_set / "pin.toml"
    original = pin.read_bytes()
    series = Series.load(patch_set)
    wrong = committed_table(series)
    final = series.manifest.final_step
    wrong["S1"] = {**wrong["S1"], final: wrong["S1"]["base"]}
    for write in (True, False):
        assert cli.expected_tables([series], measured_runs(series, wrong), write) == Exit.RACE
        assert pin.read_bytes() == original
        assert f"the final step of a series leaves races open: {final} (S1)" in (
            capsys.readouterr().out
        )
