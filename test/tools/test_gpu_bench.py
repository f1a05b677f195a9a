"""ci/bench_wait_stream.py on a machine without a GPU: its arguments and its arithmetic."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import TORCH_IN_PROCESS
from patchset.errors import Exit

pytestmark = TORCH_IN_PROCESS

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "ci" / "bench_wait_stream.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    pytest.importorskip("torch")
    loader = importlib.machinery.SourceFileLoader("bench_wait_stream", str(BENCH))
    spec = importlib.util.spec_from_loader("bench_wait_stream", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "512"], "--batch must be at most 511 (the pool has 512 rows)"),
        (["--batch", "0"], "--batch must be at least 1"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
        (["--runs", "1"], "--runs must be at least 2"),
    ],
)
def test_bad_arguments_are_refused(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_largest_batch_fits_the_pool(bench: ModuleType) -> None:
    args = bench.parse_args(["--batch", "511"])
    # rows 1..511 run and the prebuilt request takes row 512: the pool's last row
    assert args.batch + 1 == bench.POOL_ROWS


def test_a_relative_json_path_is_taken_from_the_current_folder(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert bench.parse_args(["--json", "out/bench.json"]).json == tmp_path / "out" / "bench.json"


def test_no_warmup_and_the_absolute_difference(bench: ModuleType) -> None:
    calls: list[tuple[int, bool]] = []
    seconds = {False: 0.010, True: 0.0125}

    def run(iterations: int, patched: bool) -> object:
        calls.append((iterations, patched))
        return bench.RunTimes(seconds[patched])

    result = bench.time_pairs(run, bench.parse_args(["--warmup", "0", "--runs", "2"]))
    assert calls == [(300, False), (300, True)] * 2  # no zero-iteration warm-up run
    assert result["ratio"]["median"] == pytest.approx(1.25)
    assert result["delta_ms"] == pytest.approx({"median": 2.5, "min": 2.5, "max": 2.5})
    assert "patched - unpatched ms" in bench.table({**result, "device": "d", "torch": "t"})


def test_the_wait_and_the_idle_gap_are_reported_apart(bench: ModuleType) -> None:
    """A 10 ms step; the wait call takes 4 us, the forward stands idle 52 us more patched."""

    def run(iterations: int, patched: bool) -> object:
        if patched:
            return bench.RunTimes(0.01006, wait_us=[3.0, 4.0, 5.0], gap_us=[50.0, 54.0, 60.0])
        return bench.RunTimes(0.010, gap_us=[1.0, 2.0, 3.0])

    result = bench.time_pairs(run, bench.parse_args(["--warmup", "0", "--runs", "2"]))
    assert result["step_ms"] == pytest.approx(10.0)
    assert result["wait_us"] == pytest.approx({"median": 4.0, "min": 3.0, "max": 5.0})
    assert result["idle_gap_us"] == pytest.approx(
        {"patched": 54.0, "unpatched": 2.0, "added": 52.0}
    )
    # at 1 prebuilt batch per step: 4 us and 52 us of the loop's 10,000 us step, then of
    # real decode steps of 5, 10 and 30 ms
    expected = [
        (step, synthetic, rate, rate * 4.0 / (step * 1e3), rate * 52.0 / (step * 1e3))
        for step, synthetic in ((10.0, True), (5.0, False), (10.0, False), (30.0, False))
        for rate in (1.0, 0.1, 0.01)
    ]
    got = [
        (x["step_ms"], x["synthetic"], x["rate"], x["wait"], x["idle_gap"])
        for x in result["shares"]
    ]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for (*_, wait, gap), (*_, want_wait, want_gap) in zip(got, expected, strict=True):
        assert (wait, gap) == (pytest.approx(want_wait), pytest.approx(want_gap))
    assert got[3][3] == pytest.approx(8e-4)  # 4 us of a 5 ms step
    shown = bench.table({**result, "device": "d", "torch": "t"})
    assert "the wait itself, us (host)" in shown
    assert "share of this loop's step at 0.1 prebuilt/step" in shown
    assert "share of a 30 ms step at 0.01 prebuilt/step" in shown


def test_warmup_runs_before_each_timed_run(bench: ModuleType) -> None:
    calls: list[tuple[int, bool]] = []

    def run(iterations: int, patched: bool) -> object:
        calls.append((iterations, patched))
        return bench.RunTimes(1.0)

    bench.time_pairs(run, bench.parse_args(["--runs", "2"]))
    assert calls[:4] == [(50, False), (300, False), (50, True), (300, True)]


def test_the_benchmark_refuses_without_cuda(bench: ModuleType) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device; the refusal is for machines without one")
    result = subprocess.run(
        [sys.executable, str(BENCH), "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == Exit.ENVIRONMENT
    assert result.stderr.startswith("error: bench_wait_stream.py needs a CUDA device")
    assert "next step: run it on a GPU machine" in result.stderr
    assert "Traceback" not in result.stderr
