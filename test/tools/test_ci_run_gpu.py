"""ci/run-gpu on a machine without a GPU: the plans, bad flags, stage environments, judging."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_GPU = ROOT / "ci" / "run-gpu"
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import contract, stages  # noqa: E402
from gpustage import plan as gpu_plan  # noqa: E402
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
        "preflight", "fetch-wheel", "venv", "install", "cuda-check", "facts", "apply",
        "unit-tests", "race-check", *(f"gpu-{s}" for s in steps),
        f"gpu-{steps[-1]}-long", "control-sleep-0", "control-1", "bench",
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
        assert f"{tree}:{ROOT / 'scripts'} SGLANG_BACKPORTS_STEP={step} " in block
        assert f"/gpu-{step}.xml --outcomes-json " in block and f"/gpu-{step}.json" in block
        assert "SGLANG_BACKPORTS_REQUIRE_CUDA=1" in block
        assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in block and " -p testrun.outcomes " in block
        assert "unset (hides the race): CUDA_LAUNCH_BLOCKING, CUDA_DEVICE_MAX_CONNECTIONS" in block
    assert "must pass" in stage_block(plan, f"gpu-{manifest.final_step}")
    assert "ci/bench_wait_stream.py --runs 5" in plan
    long = stage_block(plan, f"gpu-{manifest.final_step}-long")
    assert "SGLANG_BACKPORTS_S1_ITERATIONS=1000" in long
    block = stage_block(plan, "control-1")
    assert f"steps/{manifest.base.version}/base/python" in block
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 " in block
    assert "unset (hides the race): CUDA_LAUNCH_BLOCKING\n" in block
    block = stage_block(plan, "control-sleep-0")
    assert f"steps/{manifest.base.version}/base/python" in block
    assert f"{contract.NO_SLEEP_ENV}=1 " in block and "-k test_without_the_hold_back" in block
    assert "unset (hides the race): CUDA_LAUNCH_BLOCKING, CUDA_DEVICE_MAX_CONNECTIONS" in block


def test_each_selected_test_is_in_the_gpu_test_file(series: Series) -> None:
    """A -k of a stage names a test function of the file, so the stage runs something."""
    tree = ast.parse(gpu_plan.GPU_TEST.read_text(encoding="utf-8"))
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    opts = gpu_plan.Options(series, Path("/r"), 5, sys.executable, venv=Path("/v"))
    selected = [
        s.command[s.command.index("-k") + 1] for s in gpu_plan.online(opts) if "-k" in s.command
    ]
    assert len(selected) == 3, selected
    assert set(selected) <= functions, set(selected) - functions
    assert set(contract.BY_DESIGN) <= functions, set(contract.BY_DESIGN) - functions


def test_cpu_gate_stages_hide_the_gpu(plan: str) -> None:
    assert "$ env CUDA_VISIBLE_DEVICES='' " in stage_block(plan, "unit-tests")
    assert "scripts/run-tests" in stage_block(plan, "unit-tests")
    race = stage_block(plan, "race-check")
    assert "$ env CUDA_VISIBLE_DEVICES='' " in race and "race-check --step all" in race


def test_a_control_stage_keeps_the_variable_it_sets() -> None:
    stage = stages.Stage(
        "c", "p", ["true"], kind=stages.GPU, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    )
    outside = {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "CUDA_LAUNCH_BLOCKING": "1"}
    assert stages.stage_environment(stage, outside) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


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
        (["--step-files", "s"], "--step-files belongs to --offline"),
        (["--deadline", "0"], "give seconds between 0 and 86400"),
        (["--deadline", "soon"], "'soon' is not a number of seconds"),
        (["step-files"], "the following arguments are required: --out"),
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


def outcome_file(tmp_path: Path, outcomes: dict[str, str], skips: dict[str, str] | None = None):
    """An outcome file as scripts/testrun's pytest plugin writes it, and pytest's JUnit XML
    beside it with the reason of each skip."""
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"outcomes": outcomes, "properties": {}}), encoding="utf-8")
    cases = "".join(
        f'<testcase classname="t" name="{name}"><skipped type="pytest.skip" '
        f'message="{reason}">t.py:1: {reason}</skipped></testcase>'
        for name, reason in (skips or {}).items()
    )
    path.with_suffix(".xml").write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


PASSED = {"t::test_a": "pass", "t::test_b": "pass"}
XFAILED = {"t::test_c": "FAIL (expected)"}
SKIPPED = {"t::test_d": "skip"}
FAILED = {"t::test_e": "FAIL"}
BY_DESIGN = {
    "t::test_cuda_visible_import_needs_no_sgl_kernel": "skip",
    "t::test_one_hardware_queue_hides_the_race": "skip",
}
BY_DESIGN_REASONS = {
    "test_cuda_visible_import_needs_no_sgl_kernel": contract.CUDA_PRESENT,
    "test_one_hardware_queue_hides_the_race": contract.ONE_QUEUE_ONLY,
}


def judge(tmp_path: Path, cases: dict[str, str], rc: int, skips=None, rehearsal=False):
    report = outcome_file(tmp_path, cases, skips)
    return stages.judge_gpu_step(report, "shown", rehearsal, rc, tmp_path / "log")


def test_gpu_stage_accepts_the_known_failure_as_xfail(tmp_path: Path) -> None:
    ok, text = judge(tmp_path, PASSED | XFAILED, 0)
    assert ok, text
    assert text == "ok (shown): 2 pass, 1 FAIL (expected)"


def test_a_gpu_run_accepts_the_skips_by_design(tmp_path: Path) -> None:
    ok, text = judge(tmp_path, PASSED | BY_DESIGN, 0, BY_DESIGN_REASONS)
    assert ok, text
    assert text == "ok (shown; 2 skipped by design): 2 pass, 2 skip"


@pytest.mark.parametrize(
    ("skips", "refused"),
    [
        ({"test_d": "no reason given"}, "test_d (no reason given)"),
        # a test allowed to skip, but for another reason than its own
        (
            {"test_cuda_visible_import_needs_no_sgl_kernel": contract.ONE_QUEUE_ONLY},
            f"test_cuda_visible_import_needs_no_sgl_kernel ({contract.ONE_QUEUE_ONLY})",
        ),
        # a CUDA test that skipped for want of CUDA: only a rehearsal allows it
        ({"test_d": contract.NO_CUDA}, f"test_d ({contract.NO_CUDA})"),
        ({}, "test_d (no reason found)"),
    ],
    ids=["other-test", "other-reason", "no-cuda", "no-xml-entry"],
)
def test_a_gpu_run_refuses_any_other_skip(tmp_path: Path, skips: dict, refused: str) -> None:
    cases = PASSED | {f"t::{name}": "skip" for name in skips or {"test_d": ""}}
    ok, text = judge(tmp_path, cases, 0, skips)
    assert not ok, text
    assert text.endswith(f"not a skip by design on a GPU run: {refused}"), text


@pytest.mark.parametrize(
    ("cases", "rc", "why"),
    [
        (PASSED | FAILED, 1, "1 FAIL"),
        (XFAILED, 0, "nothing passed"),
    ],
    ids=["failure", "nothing-passed"],
)
def test_gpu_stage_refuses_failures(tmp_path: Path, cases: dict, rc: int, why: str):
    ok, text = judge(tmp_path, cases, rc)
    assert not ok
    assert why in text


def test_a_rehearsal_accepts_skips_for_want_of_cuda_only(tmp_path: Path) -> None:
    ok, text = judge(tmp_path, PASSED | SKIPPED, 0, {"test_d": contract.NO_CUDA}, rehearsal=True)
    assert ok and text == "ok (rehearsal: CUDA tests skipped, no GPU): 2 pass, 1 skip", text
    ok, text = judge(tmp_path, PASSED | SKIPPED, 0, {"test_d": "other"}, rehearsal=True)
    assert not ok and "not a skip by design in a rehearsal: test_d (other)" in text, text


def test_gpu_stage_without_a_report_fails(tmp_path: Path) -> None:
    ok, text = stages.judge_gpu_step(tmp_path / "missing.json", "shown", False, 4, tmp_path)
    assert not ok
    assert "no test report" in text


def test_bench_stage_reports_ratio_and_difference(tmp_path: Path) -> None:
    data = {
        "ratio": {"median": 1.01, "min": 1.0, "max": 1.02},
        "delta_ms": {"median": 0.0125, "min": 0.0, "max": 0.02},
        "wait_us": {"median": 3.25, "min": 3.0, "max": 4.0},
        "idle_gap_us": {"patched": 20.0, "unpatched": 2.0, "added": 18.0},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    ok, text = stages.judge_bench(path, 0, tmp_path)
    assert ok
    assert text == (
        "patched/unpatched 1.010 (runs 1.000..1.020); +12.5 us/iteration; "
        "the wait 3.2 us, idle gap 18.0 us"
    )


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


def test_a_stage_that_does_not_fit_the_deadline_is_not_run(tmp_path: Path) -> None:
    planned = [
        stages.Stage("quick", "p", [sys.executable, "-c", "pass"], kind=stages.GPU, budget_s=1),
        stages.Stage("long", "p", [sys.executable, "-c", "pass"], kind=stages.GPU, budget_s=60),
    ]
    assert stages.run_all(planned, tmp_path, time.monotonic() + 30) == Exit.TESTS_FAILED
    summary = (tmp_path / "summary.md").read_text()
    assert "| quick | ok " in summary
    assert "| long  | not run: deadline (60 s needed, " in summary
    assert not (tmp_path / "long.log").exists()


def test_a_stage_running_at_the_deadline_is_stopped_with_its_children(tmp_path: Path) -> None:
    """The stage's command starts a child that would outlive it; both are stopped."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    stage = stages.Stage("slow", "p", [sys.executable, "-c", code], kind=stages.GPU)
    start = time.monotonic()
    outcome = stages.run_stage(stage, {}, tmp_path, start + 3)
    assert time.monotonic() - start < 20
    assert not outcome.ok and outcome.result.startswith("FAIL: stopped at the deadline after ")
    child = int(pid_file.read_text())
    for _ in range(50):  # the killed child is reaped by init soon after
        try:
            state = Path(f"/proc/{child}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the stage's child {child} still runs")
    assert "stopped: the run's deadline came" in (tmp_path / "slow.log").read_text()


def test_a_stage_that_breaks_fails_alone_and_the_summary_is_written(tmp_path: Path) -> None:
    """A bug of ours in one stage, or in reading the figures: that stage fails, the next
    runs, and summary.md holds the table and says what could not be read."""

    def broken() -> tuple[bool, str]:
        raise ValueError("a bug in a stage")

    def figures() -> str:
        raise KeyError("bench.json has no step_ms")

    planned = [
        stages.Stage("broken", "p", ["x"], action=broken),
        stages.Stage("after", "p", ["y"], action=lambda: (True, "ok")),
    ]
    code = stages.run_all(planned, tmp_path, figures=figures)
    assert code == Exit.SETUP
    summary = (tmp_path / stages.SUMMARY_FILE).read_text()
    assert "| broken | FAIL: internal error: ValueError('a bug in a stage')" in summary
    assert "| after  | ok" in summary
    assert "not read: KeyError: 'bench.json has no step_ms'" in summary
    passing = [stages.Stage("after", "p", ["y"], action=lambda: (True, "ok"))]
    assert stages.run_all(passing, tmp_path / "again", figures=figures) == Exit.INTERNAL


def test_a_stage_log_is_written_as_the_stage_prints(tmp_path: Path) -> None:
    """Each line reaches the stage's log when it is printed, not at the end: a lent
    machine lost mid-stage leaves what the stage had said."""
    log = tmp_path / "s.log"
    code = (
        "import pathlib, sys, time; print('first', flush=True); time.sleep(0.2); "
        f"sys.exit(0 if 'first' in pathlib.Path({str(log)!r}).read_text() else 3)"
    )
    stage = stages.Stage("s", "p", [sys.executable, "-c", code])
    assert stages.run_command(stage, log) == 0, log.read_text()
