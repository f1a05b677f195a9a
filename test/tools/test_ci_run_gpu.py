"""ci/run-gpu on a machine without a GPU: the plans, bad flags, stage environments, judging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_GPU = ROOT / "ci" / "run-gpu"
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import stages  # noqa: E402
from patchset.errors import Exit  # noqa: E402
from patchset.manifest import Series  # noqa: E402


def run_gpu(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, str(RUN_GPU), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def plan() -> str:
    result = run_gpu("--dry-run")
    assert result.returncode == 0, result.stderr
    return result.stdout


def stage_block(plan: str, name: str) -> str:
    start = plan.index(f". {name}: ")
    end = plan.find("\n\n", start)
    return plan[start:end]


def test_dry_run_lists_every_stage_in_order(plan: str, series: Series) -> None:
    steps = series.manifest.steps
    names = [
        "preflight", "fetch-wheel", "venv", "install", "cuda-check", "apply",
        "unit-tests", "race-check", *(f"gpu-{s}" for s in steps), "bench",
    ]  # fmt: skip
    positions = [plan.find(f". {name}: ") for name in names]
    assert all(p >= 0 for p in positions), dict(zip(names, positions, strict=True))
    assert positions == sorted(positions)
    assert plan.rstrip().endswith("The run ends with a summary table: stage | result | time.")


def test_dry_run_gives_the_exact_commands(plan: str, series: Series) -> None:
    manifest = series.manifest
    assert manifest.base.wheel in plan
    assert "-m venv --clear" in plan
    assert "-m pip install --disable-pip-version-check" in plan
    for step in manifest.steps:
        tree = f"steps/{manifest.base.version}/{step}/python"
        block = stage_block(plan, f"gpu-{step}")
        assert f"{tree} SGLANG_BACKPORTS_STEP={step} " in block
        assert f"/gpu-{step}.xml --outcomes-json " in block and f"/gpu-{step}.json" in block
        assert "SGLANG_BACKPORTS_REQUIRE_CUDA=1" in block
        assert "unset: CUDA_LAUNCH_BLOCKING, CUDA_DEVICE_MAX_CONNECTIONS" in block
    assert "must pass" in stage_block(plan, f"gpu-{manifest.final_step}")
    assert "ci/bench_wait_stream.py --runs 5" in plan


def test_cpu_gate_stages_hide_the_gpu(plan: str) -> None:
    assert "$ env CUDA_VISIBLE_DEVICES='' " in stage_block(plan, "unit-tests")
    assert "scripts/run-tests" in stage_block(plan, "unit-tests")
    race = stage_block(plan, "race-check")
    assert "$ env CUDA_VISIBLE_DEVICES='' " in race and "race-check --step all" in race


def test_stage_environment_per_kind() -> None:
    outside = {
        "CUDA_LAUNCH_BLOCKING": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "KEEP": "yes",
    }
    for kind in (stages.SETUP, stages.CPU, stages.GPU):
        env = stages.stage_environment(stages.Stage("s", "p", ["true"], kind=kind), outside)
        assert env["KEEP"] == "yes"
        if kind == stages.CPU:
            assert env["CUDA_VISIBLE_DEVICES"] == ""
        elif kind == stages.GPU:
            assert "CUDA_LAUNCH_BLOCKING" not in env
            assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env
            assert env["CUDA_VISIBLE_DEVICES"] == "0"
        else:
            assert env == outside


def test_a_cpu_stage_really_runs_with_the_gpu_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    show = "import os; print('seen:', repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    stage = stages.Stage("cpu", "p", [sys.executable, "-c", show], kind=stages.CPU)
    outcome = stages.run_stage(stage, {}, tmp_path)
    assert outcome.ok, outcome
    assert "seen: ''" in (tmp_path / "cpu.log").read_text()


def test_dry_run_installs_nothing_and_resolves_relative_paths(tmp_path: Path) -> None:
    result = run_gpu("--dry-run", "--venv", "v", "--reports", "r", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"--junitxml={tmp_path / 'r'}/gpu-" in result.stdout
    assert f"{tmp_path / 'v'}/bin/python -m pytest" in result.stdout
    assert not (tmp_path / "v").exists() and not (tmp_path / "r").exists()


def test_steps_come_from_the_chosen_base() -> None:
    result = run_gpu("--dry-run", "--base", "0.4.0")
    assert result.returncode == Exit.BASE_MISMATCH, result.stderr
    assert "no patch set here serves sglang '0.4.0'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--bench-runs", "1"], "--bench-runs must be at least 2"),
        (["--bench-runs", "many"], "invalid int value"),
        (["--offline"], "--offline needs --wheelhouse DIR"),
        (["--wheelhouse", "w"], "--wheelhouse belongs to --offline"),
        (["--offline", "--wheelhouse", "w", "--venv", "v"], "--venv belongs to the online"),
        (["wheelhouse", "--out", "w"], "--python-version"),
    ],
)
def test_bad_flags_are_refused(args: list[str], message: str) -> None:
    result = run_gpu(*args)
    assert result.returncode == Exit.USAGE
    assert message in result.stderr


def test_help_lists_the_exit_codes() -> None:
    result = run_gpu("--help")
    assert result.returncode == 0
    assert " 14  a setup stage failed" in result.stdout
    assert " 18  a test stage failed" in result.stdout


def outcome_file(tmp_path: Path, outcomes: dict[str, str]) -> Path:
    """An outcome file as scripts/testrun's pytest plugin writes it."""
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"outcomes": outcomes, "properties": {}}), encoding="utf-8")
    return path


PASSED = {"t::test_a": "pass", "t::test_b": "pass"}
XFAILED = {"t::test_c": "FAIL (expected)"}
SKIPPED = {"t::test_d": "skip"}
FAILED = {"t::test_e": "FAIL"}


def judge(tmp_path: Path, cases: dict[str, str], rc: int, final=False, allow_skips=False):
    check = stages.judge_gpu_step(outcome_file(tmp_path, cases), final, allow_skips)
    return check(rc, tmp_path / "log")


def test_gpu_stage_accepts_the_known_failure_as_xfail(tmp_path: Path) -> None:
    ok, text = judge(tmp_path, PASSED | XFAILED, 0)
    assert ok, text
    assert text == "ok (known failure shown): 2 pass, 1 FAIL (expected)"


@pytest.mark.parametrize(
    ("cases", "rc", "why"),
    [
        (PASSED | SKIPPED, 0, "skipped on a GPU run"),
        (PASSED | FAILED, 1, "1 FAIL"),
        (XFAILED, 0, "nothing passed"),
    ],
    ids=["skip", "failure", "nothing-passed"],
)
def test_gpu_stage_refuses_skips_and_failures(tmp_path: Path, cases: dict, rc: int, why: str):
    ok, text = judge(tmp_path, cases, rc, final=True)
    assert not ok
    assert why in text


def test_a_rehearsal_accepts_skips(tmp_path: Path) -> None:
    ok, text = judge(tmp_path, PASSED | SKIPPED, 0, final=True, allow_skips=True)
    assert ok and text == "ok (rehearsal, CUDA tests skipped): 2 pass, 1 skip", text


def test_gpu_stage_without_a_report_fails(tmp_path: Path) -> None:
    check = stages.judge_gpu_step(tmp_path / "missing.json", True)
    ok, text = check(4, tmp_path)
    assert not ok
    assert "no test report" in text


def test_bench_stage_reports_ratio_and_difference(tmp_path: Path) -> None:
    data = {
        "ratio": {"median": 1.01, "min": 1.0, "max": 1.02},
        "delta_ms": {"median": 0.0125, "min": 0.0, "max": 0.02},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    ok, text = stages.judge_bench(path)(0, tmp_path)
    assert ok
    assert text == "patched/unpatched 1.010 (runs 1.000..1.020); +12.5 us/iteration"


def test_exit_code_separates_setup_from_test_failures() -> None:
    setup = stages.Outcome("install", False, "FAIL", 1.0, stages.SETUP)
    test = stages.Outcome("gpu-x", False, "FAIL", 1.0, stages.GPU)
    fine = stages.Outcome("bench", True, "ok", 1.0, stages.GPU)
    assert stages.exit_code([fine]) == Exit.OK
    assert stages.exit_code([fine, test]) == Exit.TESTS_FAILED
    assert stages.exit_code([setup, test]) == Exit.SETUP


def test_summary_table_has_stage_result_time() -> None:
    outcomes = [
        stages.Outcome("preflight", True, "ok", 0.04),
        stages.Outcome("gpu-x", False, "FAIL: 1 failed", 12.5),
    ]
    lines = stages.summary_table(outcomes).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["stage", "result", "time"]
    assert "| gpu-x     | FAIL: 1 failed | 12.5 s |" in lines


def test_a_failed_setup_stage_stops_its_dependants_and_exits_setup(tmp_path: Path) -> None:
    planned = [
        stages.Stage("install", "p", [sys.executable, "-c", "raise SystemExit(3)"]),
        stages.Stage("gpu-x", "p", ["true"], kind=stages.GPU, needs=("install",)),
    ]
    assert stages.run_all(planned, tmp_path) == Exit.SETUP
    summary = (tmp_path / "summary.md").read_text()
    assert "| install | FAIL: exit 3" in summary
    assert "not run: install failed" in summary
