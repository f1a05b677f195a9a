"""The race table of issue 4, measured from this step's real sglang code.

Each scenario runs through the step's FutureMap, build_eagle_disagg_draft_input
and get_new_prebuilt_batch on simulated streams whose ordering feeds PyTorch's
CUDA sanitizer (scripts/racecheck). The row of the table for this step must be
exactly the expected one, and a scenario's race must be closed on the steps
that carry its fix and open on the others.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from racecheck import report, scenarios
from testrun.steps import StepUnderTest


@pytest.fixture(scope="module")
def measured() -> dict[str, scenarios.ScenarioRun]:
    return {run.name: run for run in scenarios.run_all()}


def _races_text(run: scenarios.ScenarioRun) -> str:
    return "\n".join(report.race_text(race) for race in run.races) or "(no race)"


@pytest.mark.parametrize("name", report.SCENARIOS)
def test_table_row(
    name: str,
    step: StepUnderTest,
    measured: dict[str, scenarios.ScenarioRun],
    record_property: Callable[[str, object], None],
) -> None:
    cell = report.cell_of(measured[name].races)
    # scripts/run-tests gathers these from the junit xml into the race table.
    record_property(f"race:{name}", report.describe(cell))
    expected = report.EXPECTED[name][step.name]
    assert cell == expected, (
        f"{name} on {report.step_label(step.name)}: measured '{report.describe(cell)}', "
        f"expected '{report.describe(expected)}'\n{_races_text(measured[name])}"
    )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("S1", marks=pytest.mark.pass_on("fix-b")),
        pytest.param("S2", marks=pytest.mark.pass_on("fix-a", "fix-b")),
        pytest.param("S3", marks=pytest.mark.pass_on("fix-b")),
    ],
)
def test_race_closed(name: str, measured: dict[str, scenarios.ScenarioRun]) -> None:
    assert measured[name].races == [], _races_text(measured[name])


@pytest.mark.parametrize("name", report.SCENARIOS)
def test_races_name_real_sites(
    name: str, step: StepUnderTest, measured: dict[str, scenarios.ScenarioRun]
) -> None:
    """Every reported site is a line of this step's sglang that indexes a relay buffer."""
    races = measured[name].races
    if not report.EXPECTED[name][step.name]:
        pytest.skip(f"no race to locate in {name} on {report.step_label(step.name)}")
    assert races
    python = scenarios.sglang_root().parent
    for race in races:
        for access in (race.first, race.second):
            site = access.code[0]
            line = (python / site.file).read_text().splitlines()[site.line - 1]
            assert f"{race.buffer}[" in line, f"{site}: {line.strip()}"
        assert race.second.stream == ("consumer_stream" if name == "S2" else "schedule_stream")
        assert race.first.stream == "forward_stream"
    if name != "S2":
        callers = {(s.file, s.function) for race in races for s in race.second.code}
        assert ("sglang/srt/disaggregation/decode.py", "get_new_prebuilt_batch") in callers
