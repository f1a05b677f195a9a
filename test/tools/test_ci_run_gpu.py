"""ci/run-gpu on a machine without a GPU: the plan, bad flags, and how it judges GPU runs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_GPU = ROOT / "ci" / "run-gpu"
STEPS = ("base", "0001", "0002")


def run_gpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_GPU), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def run_gpu_module() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("ci_run_gpu", str(RUN_GPU))
    spec = importlib.util.spec_from_loader("ci_run_gpu", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_run_gpu"] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plan() -> str:
    result = run_gpu("--dry-run")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_dry_run_lists_every_stage_in_order(plan: str) -> None:
    names = [
        "preflight", "fetch-wheel", "venv", "install", "cuda-check", "apply",
        "unit-tests", "race-check", *(f"gpu-{s}" for s in STEPS), "bench",
    ]  # fmt: skip
    positions = [plan.find(f". {name}: ") for name in names]
    assert all(p >= 0 for p in positions), dict(zip(names, positions, strict=True))
    assert positions == sorted(positions)
    assert plan.rstrip().endswith("The run ends with a summary table: stage | result | time.")


def test_dry_run_gives_the_exact_commands(plan: str) -> None:
    assert "sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl" in plan
    assert "-m venv --clear" in plan
    assert "-m pip install --disable-pip-version-check" in plan
    assert "scripts/run-tests" in plan
    assert "scripts/race-check --step all" in plan
    for step in STEPS:
        tree = f"build/steps/{step}/python"
        assert f"PYTHONPATH={ROOT / tree} SGLANG_BACKPORTS_STEP={step} " in plan
        assert f"gpu-{step}.xml" in plan
    assert "SGLANG_BACKPORTS_REQUIRE_CUDA=1" in plan
    assert "ci/bench_wait_stream.py --runs 5" in plan


def test_dry_run_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    reports = tmp_path / "reports"
    result = run_gpu("--dry-run", "--venv", str(venv), "--reports", str(reports))
    assert result.returncode == 0, result.stderr
    assert str(venv) in result.stdout
    assert not venv.exists()
    assert not reports.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--bench-runs", "1"], "--bench-runs must be at least 2"),
        (["--bench-runs", "many"], "invalid int value"),
    ],
)
def test_bad_flags_are_refused(args: list[str], message: str) -> None:
    result = run_gpu(*args)
    assert result.returncode == 2
    assert message in result.stderr


def junit(tmp_path: Path, cases: str) -> Path:
    path = tmp_path / "gpu.xml"
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


PASSED = '<testcase name="a"/>'
XFAILED = '<testcase name="b"><skipped type="pytest.xfail" message="guards a fix"/></testcase>'
SKIPPED = '<testcase name="c"><skipped type="pytest.skip" message="no CUDA device"/></testcase>'
FAILED = '<testcase name="d"><failure message="boom"/></testcase>'


def test_gpu_stage_accepts_the_known_failure_as_xfail(
    run_gpu_module: ModuleType, tmp_path: Path
) -> None:
    xml_path = junit(tmp_path, PASSED * 2 + XFAILED * 2)
    ok, text = run_gpu_module.judge_gpu_step("base", xml_path)(0, tmp_path / "log")
    assert ok, text
    assert "2 passed, 2 xfailed, 0 skipped" in text


@pytest.mark.parametrize(
    ("cases", "rc", "why"),
    [
        (PASSED + SKIPPED, 0, "skipped on a GPU run"),
        (PASSED + FAILED, 1, "1 failed"),
        (XFAILED, 0, "nothing passed"),
    ],
    ids=["skip", "failure", "nothing-passed"],
)
def test_gpu_stage_refuses_skips_and_failures(
    run_gpu_module: ModuleType, tmp_path: Path, cases: str, rc: int, why: str
) -> None:
    ok, text = run_gpu_module.judge_gpu_step("0002", junit(tmp_path, cases))(rc, tmp_path / "log")
    assert not ok
    assert why in text


def test_gpu_stage_without_a_report_fails(run_gpu_module: ModuleType, tmp_path: Path) -> None:
    ok, text = run_gpu_module.judge_gpu_step("0002", tmp_path / "missing.xml")(4, tmp_path)
    assert not ok
    assert "no JUnit report" in text


def test_summary_table_has_stage_result_time(run_gpu_module: ModuleType) -> None:
    outcomes = [
        run_gpu_module.Outcome("preflight", True, "ok", 0.04),
        run_gpu_module.Outcome("gpu-0002", False, "FAIL: 1 failed", 12.5),
    ]
    lines = run_gpu_module.summary_table(outcomes).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["stage", "result", "time"]
    assert "| gpu-0002  | FAIL: 1 failed | 12.5 s |" in lines


def test_bench_refuses_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device; the refusal is for machines without one")
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "bench_wait_stream.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "needs a CUDA device" in result.stderr
