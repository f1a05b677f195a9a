"""Stages of the GPU pipeline: their environment, how they run, how they are judged."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from patchset import textout
from patchset.errors import Exit
from patchset.paths import PROJECT_ROOT
from testrun import outcomes as testrun_outcomes

# Setup stages prepare the run; a failure there is Exit.SETUP. Test stages
# (the CPU gate, the GPU tests, the benchmark) fail with Exit.TESTS_FAILED.
SETUP, CPU, GPU = "setup", "cpu", "gpu"

# Variables that would hide the race on a GPU: serialised launches, one hardware queue.
HIDES_THE_RACE = ("CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS")

Judge = Callable[[int, Path], tuple[bool, str]]


@dataclass
class Stage:
    name: str
    purpose: str
    command: list[str]
    kind: str = SETUP
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    # turns a finished run into (ok, result text); default: exit status 0
    judge: Judge | None = None
    # a reason the command cannot run here, said in the plan and as the result
    missing: str | None = None
    # run in-process instead of as a command; same contract as judge
    action: Callable[[], tuple[bool, str]] | None = None


@dataclass
class Outcome:
    stage: str
    ok: bool
    result: str
    seconds: float
    kind: str = SETUP


def stage_environment(stage: Stage, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a stage runs in.

    CPU-gate stages see no GPU (CUDA_VISIBLE_DEVICES=""), so sglang takes its
    CPU import branches there. GPU stages lose the variables that hide the race.
    """
    env = {**base, **stage.env}
    if stage.kind == CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif stage.kind == GPU:
        for name in HIDES_THE_RACE:
            env.pop(name, None)
    return env


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def shell_line(stage: Stage) -> str:
    # what the stage sets on top of the caller's environment
    shown = stage_environment(stage, {})
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
    words = " ".join(w if w == "&&" else shlex.quote(w) for w in stage.command)
    return f"env {env} {words}" if env else words


def print_plan(title: str, facts: dict[str, str], stages: list[Stage]) -> None:
    print(f"{title} (dry run: nothing is run, installed or downloaded)")
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"  {key.ljust(width)}  {value}")
    for number, stage in enumerate(stages, 1):
        print(f"\n{number:2}. {stage.name}: {stage.purpose}")
        if stage.needs:
            print(f"    needs: {', '.join(stage.needs)}")
        if stage.kind == GPU:
            print(f"    unset: {', '.join(HIDES_THE_RACE)} (they hide the race)")
        print(f"    $ {shell_line(stage)}")
        if stage.missing:
            print(f"    MISSING: {stage.missing}; a real run fails this stage")
    print("\nThe run ends with a summary table: stage | result | time.")


def split_and(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    return parts


def run_command(stage: Stage, log: Path) -> int:
    env = stage_environment(stage, os.environ)
    with log.open("w", encoding="utf-8") as out:
        for part in split_and(stage.command):
            out.write(f"$ {shlex.join(part)}\n")
            out.flush()
            proc = subprocess.Popen(
                part,
                cwd=PROJECT_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                out.write(line)
            rc = proc.wait()
            if rc != 0:
                return rc
    return 0


def run_stage(stage: Stage, done: dict[str, bool], reports: Path) -> Outcome:
    start = time.monotonic()
    print(f"\n=== {stage.name}: {stage.purpose}", flush=True)

    def outcome(ok: bool, text: str) -> Outcome:
        return Outcome(stage.name, ok, text, time.monotonic() - start, stage.kind)

    blocked = [n for n in stage.needs if not done.get(n, False)]
    if blocked:
        return outcome(False, f"not run: {', '.join(blocked)} failed")
    if stage.missing:
        print(f"error: {stage.missing}", file=sys.stderr)
        return outcome(False, f"FAIL: {stage.missing}")
    if stage.action is not None:
        ok, text = stage.action()
        print(text)
        return outcome(ok, text)
    log = reports / f"{stage.name}.log"
    try:
        rc = run_command(stage, log)
    except OSError as err:
        return outcome(False, f"FAIL: {err}")
    if stage.judge is not None:
        return outcome(*stage.judge(rc, log))
    return outcome(rc == 0, "ok" if rc == 0 else f"FAIL: exit {rc}")


def read_outcomes(report: Path) -> dict[str, str]:
    """test -> outcome of one pytest run, from the outcome file of scripts/testrun's plugin."""
    return testrun_outcomes.read_outcomes(report)[0]


def judge_gpu_step(report: Path, final: bool, allow_skips: bool = False) -> Judge:
    """A GPU stage passes when every test passed or failed as expected (strict xfail)."""

    def judge(rc: int, _log: Path) -> tuple[bool, str]:
        if not report.is_file():
            return False, f"FAIL: no test report (pytest exit {rc})"
        outcomes = list(read_outcomes(report).values())
        counts = {o: outcomes.count(o) for o in dict.fromkeys(outcomes)}
        good = counts.get(testrun_outcomes.PASS, 0)
        text = ", ".join(f"{n} {o}" for o, n in counts.items()) or "no tests"
        bad = len(outcomes) - good - counts.get(testrun_outcomes.EXPECTED_FAIL, 0)
        skipped = counts.get(testrun_outcomes.SKIP, 0)
        if rc != 0 or bad - skipped:
            return False, f"FAIL: {text}"
        if skipped and not allow_skips:
            return False, f"FAIL: skipped on a GPU run: {text}"
        if good == 0:
            return False, f"FAIL: nothing passed: {text}"
        if skipped:
            return True, f"ok (rehearsal, CUDA tests skipped): {text}"
        shown = "fix holds" if final else "known failure shown"
        return True, f"ok ({shown}): {text}"

    return judge


def judge_with_warnings(rc: int, log: Path) -> tuple[bool, str]:
    """Exit status 0 passes; WARNING and FAIL lines of the log are carried into the result."""
    warnings = [
        line.strip() for line in log.read_text(encoding="utf-8").splitlines()
        if line.startswith(("WARNING: ", "FAIL: "))
    ]  # fmt: skip
    if rc != 0:
        return False, f"FAIL: exit {rc}" + "".join(f"; {w}" for w in warnings)
    return True, "; ".join(["ok", *warnings])


def judge_bench(json_path: Path) -> Judge:
    def judge(rc: int, _log: Path) -> tuple[bool, str]:
        if rc != 0 or not json_path.is_file():
            return False, f"FAIL: exit {rc}"
        data = json.loads(json_path.read_text(encoding="utf-8"))
        ratio, delta = data["ratio"], data["delta_ms"]
        return True, (
            f"patched/unpatched {ratio['median']:.3f} (runs {ratio['min']:.3f}.."
            f"{ratio['max']:.3f}); +{delta['median'] * 1e3:.1f} us/iteration"
        )

    return judge


def exit_code(outcomes: list[Outcome]) -> Exit:
    if any(not o.ok and o.kind == SETUP for o in outcomes):
        return Exit.SETUP
    if any(not o.ok for o in outcomes):
        return Exit.TESTS_FAILED
    return Exit.OK


def summary_table(outcomes: list[Outcome]) -> str:
    """stage | result | time, as a markdown table."""
    rows = [(o.stage, o.result, f"{o.seconds:.1f} s") for o in outcomes]
    return textout.table(("stage", "result", "time"), rows, markdown=True)


def run_all(stages: list[Stage], reports: Path) -> Exit:
    """Run the stages in order, print and store the summary; the run's exit code."""
    reports.mkdir(parents=True, exist_ok=True)
    done: dict[str, bool] = {}
    outcomes: list[Outcome] = []
    for stage in stages:
        outcome = run_stage(stage, done, reports)
        done[stage.name] = outcome.ok
        outcomes.append(outcome)
    table = summary_table(outcomes)
    code = exit_code(outcomes)
    verdict = "all stages passed" if code == Exit.OK else "FAILED"
    print(f"\nci/run-gpu summary: {verdict}\n{table}")
    report = f"## ci/run-gpu: {verdict}\n\n{table}\n"
    (reports / "summary.md").write_text(report, encoding="utf-8")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as out:
            out.write(report)
    return code
