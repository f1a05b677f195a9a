"""The race table, measured from this step's real sglang code.

Each scenario (scripts/patchset/plays.py) runs through the step's
FutureMap, build_eagle_disagg_draft_input, get_new_prebuilt_batch and WAR
barrier (each release's own signatures, detected on its functions) on
simulated streams whose ordering feeds PyTorch's CUDA sanitizer
(scripts/racecheck). The step's column must be exactly the expected one (the
[races] table of the step's pin manifest, row by row),
and a scenario's race must be closed on the steps where that table says so
and open on the others.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import pytest
from patchset.plays import BY_NAME, SCENARIOS
from racecheck import csan, report, scenarios
from racecheck.report import Race
from testrun.steps import StepUnderTest, load_step

STEP = load_step()
MANIFEST = STEP.series.manifest
if not MANIFEST.races:
    pytest.skip(
        f"the manifest of sglang {MANIFEST.base.version} holds no expected race table "
        "([races]); write it with scripts/race-check --write-expected --base VERSION",
        allow_module_level=True,
    )
EXPECTED = report.expected_table(MANIFEST, SCENARIOS)


@pytest.fixture(scope="module")
def measured() -> dict[str, list[Race]]:
    return {name: scenarios.run(name) for name in SCENARIOS}


def _races_text(races: list[Race]) -> str:
    return "\n".join(report.race_text(race) for race in races) or "(no race)"


@pytest.mark.parametrize("name", SCENARIOS)
def test_table_row(
    name: str,
    step: StepUnderTest,
    measured: dict[str, list[Race]],
    record_property: Callable[[str, object], None],
) -> None:
    cell = report.cell_of(measured[name])
    # scripts/run-tests gathers these from the junit xml into the race table.
    record_property(f"race:{name}", report.describe(cell))
    expected = EXPECTED[name][step.name]
    assert cell == expected, (
        f"{name} on {report.step_label(step.name)}: measured '{report.describe(cell)}', "
        f"expected '{report.describe(expected)}'\n{_races_text(measured[name])}\n"
        "if the change is wanted, write the tables with scripts/race-check --write-expected"
    )


def test_the_torch_it_ran_on_is_reported(record_property: Callable[[str, object], None]) -> None:
    import torch

    record_property("race:torch", csan.torch_text(torch.__version__))
    assert csan.check_shape(csan.load()) == []


def _closed_on(name: str) -> list[str]:
    return [step for step in MANIFEST.steps if not EXPECTED[name][step]]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[]
            if STEP.name in _closed_on(name)
            else pytest.mark.xfail(
                strict=True,
                raises=AssertionError,
                reason=f"{name} is open on {STEP.name} (closed on {', '.join(_closed_on(name))})",
            ),
        )
        for name in SCENARIOS
        if len(_closed_on(name)) < len(MANIFEST.steps)
    ],
)
def test_race_closed(name: str, measured: dict[str, list[Race]]) -> None:
    assert measured[name] == [], _races_text(measured[name])


@pytest.mark.parametrize("name", SCENARIOS)
def test_races_name_real_sites(
    name: str, step: StepUnderTest, measured: dict[str, list[Race]]
) -> None:
    """Every reported site is a line of this step's sglang that indexes a relay buffer,
    and every raced row is a row the in-flight forward wrote and the batch reuses."""
    races = measured[name]
    if not EXPECTED[name][step.name]:
        pytest.skip(f"no race to locate in {name} on {report.step_label(step.name)}")
    assert races
    play = BY_NAME[name]
    python = scenarios.sglang_root().parent
    for race in races:
        for access in (race.first, race.second):
            site = access.code[0]
            line = (python / site.file).read_text().splitlines()[site.line - 1]
            assert f"{race.buffer}[" in line, f"{site}: {line.strip()}"
        assert race.first.stream == "forward_stream"
        if play.consumer:
            assert race.second.stream == "consumer_stream"
            assert race.row in play.finished
        else:
            assert race.second.stream == "schedule_stream"
            assert race.row in set(play.prebuilt) & set(play.finished)
    if not play.consumer:
        callers = {(s.file, s.function) for race in races for s in race.second.code}
        seeder = (
            ("sglang/srt/managers/scheduler.py", "_build_hisparse_decode_batch")
            if play.hisparse
            else ("sglang/srt/disaggregation/decode.py", "get_new_prebuilt_batch")
        )
        assert seeder in callers


def test_hisparse_stash_is_ordered_by_the_host_synchronize() -> None:
    """H1 is clean because of process_batch_result_prefill's copy_done.synchronize():
    played again with every host synchronize of an event doing nothing, the
    same scenario races: the forward stream's relay write into the row and the
    schedule stream's stash from _build_hisparse_decode_batch, unordered."""
    from racecheck.csan import SimEvent

    with mock.patch.object(SimEvent, "synchronize", autospec=True) as synchronize:
        races = scenarios.run("H1")
    assert synchronize.call_count >= 1  # the prefill result's copy_done
    cell = report.cell_of(races)
    assert cell == {("write/write", "output_tokens_buf", 3)}, _races_text(races)
    (race,) = races
    assert (race.first.stream, race.second.stream) == ("forward_stream", "schedule_stream")
    callers = {s.function for s in race.second.code}
    assert "_build_hisparse_decode_batch" in callers
