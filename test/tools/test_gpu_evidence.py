"""The GPU run's summary: each figure beside its expected value, the criteria, the tarball."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import contract, evidence  # noqa: E402
from patchset.manifest import Series  # noqa: E402

FIELDS = ("seq_len", "token", "topk_p", "topk_index", "hidden")


def s1(iterations: int, seed_won: int, stale: dict[str, int], torn: int = 0) -> dict:
    """An S1 record as RaceTally.record writes it."""
    return {
        "iterations": iterations, "seed_won": seed_won, "stale_fields": stale, "torn": torn,
        "running_row_wrong": 0, "sleep_target_ms": 20.0, "sleep_cycles": 123,
        "slept_ms": {"median": 20.4, "min": 20.1, "max": 23.0}, "connections": None,
    }  # fmt: skip


def stage_record(reports: Path, stage: str, **properties: dict) -> None:
    data = {"outcomes": {}, "properties": {k: json.dumps(v) for k, v in properties.items()}}
    (reports / f"{stage}.json").write_text(json.dumps(data))


def table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| -"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_each_figure_is_judged_against_its_criterion(tmp_path: Path, series: Series) -> None:
    evidence.write_criteria(tmp_path)
    all_stale = dict.fromkeys(FIELDS, 200)
    race = {"race": True, "iteration": 0, "buffers": ["new_seq_lens_buf"]}
    warm = "NVIDIA H200, 580.159.04, P0, 1980 MHz, 1980 MHz, 3201 MHz, 41, 250.00 W"
    stage_record(tmp_path, "gpu-base", s1={**s1(200, 0, all_stale), "clocks_warm": warm}, csan=race)
    # 0001: seq_len stale in 199, the stash fields split
    split = {"seq_len": 199, "token": 100, "topk_p": 90, "topk_index": 90, "hidden": 80}
    stage_record(tmp_path, "gpu-0001", s1=s1(200, 1, split), csan=race)
    # 0002: one torn row is a failure of the criterion; CSAN silent as it must be
    stage_record(
        tmp_path,
        "gpu-0002",
        s1=s1(200, 199, dict.fromkeys(FIELDS, 0), torn=1),
        csan={"race": False, "iterations": 4},
    )
    # sleep 0 on the base step: the seed wins in 170 of 200, under the 90 % asked
    stage_record(tmp_path, "control-sleep-0", s1=s1(200, 170, dict.fromkeys(FIELDS, 30)))
    stage_record(tmp_path, "control-1", s1=s1(200, 200, dict.fromkeys(FIELDS, 0)))
    text = evidence.figures(tmp_path, series.manifest, ["gpu-base", "bench"])
    rows = table_rows(text)
    assert rows["step base: S1 stale per field"][1:] == [">= 90% every field", "yes"]
    assert rows["step base: CSAN"] == [
        "race at iteration 0 on new_seq_lens_buf", "race reported", "yes"
    ]  # fmt: skip
    assert rows["step 0001: S1 seq_len stale"] == ["199/200 (99.5%)", ">= 90%", "yes"]
    assert rows["step 0001: S1 stash fields stale"][0].startswith(
        "seq_len 199/200 (99.5%), token 100/200 (50.0%)"
    )
    assert rows["step 0002: S1 seed kept"] == [
        "199/200 (99.5%); torn rows 1", "every iteration, no torn row", "NO"
    ]  # fmt: skip
    assert rows["step 0002: CSAN"] == ["silent over 4 iterations", "silent", "yes"]
    assert rows["step base: measured sleep"][0] == "20.40 ms median (20.10..23.00) for 20 ms asked"
    assert rows["step base: clocks after the warm-up"] == [warm, "near the max", "reported"]
    assert "step 0001: clocks after the warm-up" not in rows  # not read: not shown
    assert rows["control base, sleep 0: S1 seed kept, forward not held back"] == [
        "170/200 (85.0%); torn rows 0", ">= 90%", "NO"
    ]  # fmt: skip
    assert rows["control base, 1 connection (hides the race): S1 seed kept"][-1] == "yes"
    assert rows["step 0002, long run: S1 seed kept"][0] == evidence.NOT_RUN
    assert rows["benchmark"] == [evidence.NOT_RUN, "measured", "no"]
    assert text.endswith(evidence.CRITERIA)


def test_the_benchmark_figures_are_shown_apart(tmp_path: Path, series: Series) -> None:
    evidence.write_criteria(tmp_path)
    bench = {
        "step_ms": 10.0,
        "wait_us": {"median": 4.0, "min": 3.0, "max": 5.0},
        "idle_gap_us": {"patched": 54.0, "unpatched": 2.0, "added": 52.0},
        "shares": [  # as bench_wait_stream.shares(4.0, 52.0, 1.25) writes them
            {
                "step_ms": step,
                "synthetic": step == 1.25,
                "rate": rate,
                "wait": rate * 4.0 / (step * 1e3),
                "idle_gap": rate * 52.0 / (step * 1e3),
            }
            for step in (1.25, 5.0, 10.0, 30.0)
            for rate in (1.0, 0.1, 0.01)
        ],
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    rows = table_rows(evidence.figures(tmp_path, series.manifest, ["bench"]))
    assert rows["benchmark: the wait itself"][0] == "4.0 us per prebuilt batch (host)"
    assert rows["benchmark: idle gap"][0].startswith("52.0 us per prebuilt batch (GPU idle")
    rates = "at 1 / 0.1 / 0.01 prebuilt/step"
    # 4 us and 52 us of the loop's 1.25 ms step: overstated beside real decode steps
    assert rows[f"benchmark: share of the loop's synthetic 1.25 ms step {rates}"][:2] == [
        "wait 0.320% / 0.032% / 0.003%; idle gap 4.160% / 0.416% / 0.042%",
        "measured (overstated: real steps are 5 to 30 ms)",
    ]
    assert rows[f"benchmark: share of a 5 ms step {rates}"][0] == (
        "wait 0.080% / 0.008% / 0.001%; idle gap 1.040% / 0.104% / 0.010%"
    )
    assert rows[f"benchmark: share of a 30 ms step {rates}"][0].startswith("wait 0.013% / ")


def test_the_criteria_name_the_thresholds_the_tests_use() -> None:
    assert f"{contract.S1_MIN_ITERATIONS} S1 iterations" in evidence.CRITERIA.replace("\n  ", " ")
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 hides the race" in evidence.CRITERIA


def test_the_reports_are_packed_into_one_tarball(tmp_path: Path) -> None:
    reports = tmp_path / "ci-reports"
    evidence.write_criteria(reports)
    (reports / "summary.md").write_text("## ci/run-gpu\n")
    tarball = evidence.pack(reports, tmp_path / "out" / "gpu.tar.gz")
    with tarfile.open(tarball) as archive:
        names = sorted(archive.getnames())
    assert names == ["ci-reports", "ci-reports/criteria.md", "ci-reports/summary.md"]
    assert not list(tarball.parent.glob("*.partial"))


def test_the_csan_child_fits_one_command_of_a_lent_machine() -> None:
    """A lent machine runs a command for at most 600 s; the child must end well before."""
    assert contract.CSAN_TIMEOUT_S < 600
    test_file = (ROOT / "test" / "steps" / "test_gpu_prebuilt_race.py").read_text()
    assert "timeout=contract.CSAN_TIMEOUT_S" in test_file
