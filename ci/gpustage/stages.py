"""Stages of the GPU pipeline: their environment, how they run, how they are judged."""

import contextlib
import io
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any, NamedTuple, TextIO
from xml.etree import ElementTree

from patchset import textout
from patchset.errors import BackportError, Exit
from patchset.paths import PROJECT_ROOT
from testrun import outcomes as testrun_outcomes

from . import contract

SETUP, CPU, GPU = "setup", "cpu", "gpu"
# Variables that would hide the race on a GPU: serialised launches, one hardware queue.
HIDES_THE_RACE = ("CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS")
Verdict = tuple[bool, str]  # ok, and the stage's result line
Judge = Callable[[int, Path], Verdict]
Figures = Callable[[], str]  # the measured figures, as markdown below the stage table
SUMMARY_FILE = "summary.md"
RESERVE_S = 10.0  # kept from a --deadline for the summary and the tarball
# each command in its own process group: the deadline or an interrupt stops all it started
_PIPED: dict[str, Any] = {"stdout": PIPE, "stderr": STDOUT, "text": True, "start_new_session": True}


@dataclass
class Stage:
    name: str
    purpose: str
    command: list[str]
    kind: str = SETUP
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    judge: Judge | None = None  # a finished run's (ok, result text); default: exit status 0
    action: Callable[[], Verdict] | None = None  # in-process instead of the command
    budget_s: float = 0.0  # the least time it needs: not started with less left


class Outcome(NamedTuple):
    stage: str
    ok: bool
    result: str
    seconds: float
    kind: str = SETUP


def stage_environment(stage: Stage, base: Mapping[str, str]) -> dict[str, str]:
    """GPU stages lose what hides the race (unless set: the controls); the CPU gate sees no GPU."""
    hidden = HIDES_THE_RACE if stage.kind == GPU else ()
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""} if stage.kind == CPU else {}
    return {k: v for k, v in base.items() if k not in hidden} | stage.env | no_gpu


def rel(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path)


def print_plan(title: str, facts: dict[str, str], stages: list[Stage]) -> None:
    print(f"{title} (dry run: nothing is run, installed or downloaded)")
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"  {key.ljust(width)}  {value}")
    for number, stage in enumerate(stages, 1):
        print(f"\n{number:2}. {stage.name}: {stage.purpose}")
        if stage.needs:
            print(f"    needs: {', '.join(stage.needs)}")
        if stage.kind == GPU and (unset := [n for n in HIDES_THE_RACE if n not in stage.env]):
            print(f"    unset (hides the race): {', '.join(unset)}")
        if stage.budget_s:
            print(f"    starts only with {stage.budget_s:.0f} s left before a --deadline")
        # what the stage sets on top of the caller's environment
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in stage_environment(stage, {}).items())
        words = " ".join(w if w == "&&" else shlex.quote(w) for w in stage.command)
        print(f"    $ {f'env {env} {words}' if env else words}")
    print("\nThe run ends with a summary table: stage | result | time.")


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_command(stage: Stage, log: Path, end: float | None = None) -> int | None:
    """The first failing `&&` part's status, else 0; None when stopped at end (time.monotonic())."""
    env = stage_environment(stage, os.environ) | {"PYTHONUNBUFFERED": "1"}  # logs as printed
    parts = [list(w) for sep, w in itertools.groupby(stage.command, "&&".__eq__) if not sep]
    with log.open("w", encoding="utf-8") as out:
        for part in parts:
            print(f"$ {shlex.join(part)}", file=out, flush=True)
            proc = subprocess.Popen(part, cwd=PROJECT_ROOT, env=env, **_PIPED)
            timer = threading.Timer(max(0.0, (end or 0) - time.monotonic()), _kill, (proc,))
            if end is not None:
                timer.start()
            try:  # line by line: the log is current if the machine is lost mid-stage
                _Tee(sys.stdout, out).writelines(proc.stdout or ())
                rc = proc.wait()
            except BaseException:
                _kill(proc)
                raise
            finally:
                timer.cancel()
            if end is not None and rc == -signal.SIGKILL and time.monotonic() >= end:
                out.write("stopped: the run's deadline came\n")
                return None
            if rc != 0:
                return rc
    return 0


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)


@contextlib.contextmanager
def tee_output(path: Path) -> Iterator[None]:
    """What is printed inside also goes to path as it is printed, and so does an internal error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        path.open("w", encoding="utf-8") as log,
        contextlib.redirect_stdout(_Tee(sys.stdout, log)),
        contextlib.redirect_stderr(_Tee(sys.stderr, log)),
    ):
        try:
            yield
        except BaseException as err:
            log.write("".join(traceback.format_exception(err)))
            raise


def run_stage(stage: Stage, passed: set[str], reports: Path, end: float | None = None) -> Outcome:
    """passed: the stages that passed; end: the time.monotonic() by which all must be over."""
    start = time.monotonic()
    print(f"\n=== {stage.name}: {stage.purpose}", flush=True)

    def outcome(ok: bool, text: str) -> Outcome:
        return Outcome(stage.name, ok, text, time.monotonic() - start, stage.kind)

    if blocked := [n for n in stage.needs if n not in passed]:
        return outcome(False, f"not run: {', '.join(blocked)} failed")
    left = None if end is None else end - time.monotonic()
    if left is not None and left < (need := stage.budget_s):
        print(f"not run: {left:.0f} s left before the deadline, it needs {need:.0f} s")
        return outcome(False, f"not run: deadline ({need:.0f} s needed, {left:.0f} s left)")
    if stage.action is not None:
        try:
            ok, text = stage.action()
        except BackportError as err:  # a refusal fails the stage with its message
            print(f"error: {err}", file=sys.stderr)
            ok, text = False, f"FAIL: {err.problem}"
        print(text)
        return outcome(ok, text)
    log = reports / f"{stage.name}.log"
    try:
        rc = run_command(stage, log, end)
    except OSError as err:
        return outcome(False, f"FAIL: {err}")
    if rc is None:
        took = time.monotonic() - start
        return outcome(False, f"FAIL: stopped at the deadline after {took:.0f} s")
    if stage.judge is not None:
        return outcome(*stage.judge(rc, log))
    return outcome(rc == 0, "ok" if rc == 0 else f"FAIL: exit {rc}")


def judge_gpu_step(report: Path, shown: str, rehearsal: bool, rc: int, _log: Path) -> Verdict:
    """Each test passed or xfailed (strict); a skip only by design (its reason from the XML)."""
    if not report.is_file():
        return False, f"FAIL: no test report (pytest exit {rc})"
    by_test = testrun_outcomes.read_outcomes(report)[0]
    counts = Counter(by_test.values())
    good, skipped = counts[testrun_outcomes.PASS], counts[testrun_outcomes.SKIP]
    text = ", ".join(f"{n} {o}" for o, n in counts.items()) or "no tests"
    if rc != 0 or counts.total() > good + counts[testrun_outcomes.EXPECTED_FAIL] + skipped:
        return False, f"FAIL: {text}"
    xml = report.with_suffix(".xml")
    skipped_cases = ElementTree.parse(xml).iterfind(".//testcase[skipped]") if xml.is_file() else ()
    reasons = {c.get("name", ""): c.findall("skipped")[0].get("message", "") for c in skipped_cases}
    if refused := [
        f"{test} ({reasons.get(test) or 'no reason found'})"
        for test in (n.partition("::")[2] for n, o in by_test.items() if o == testrun_outcomes.SKIP)
        if not contract.allowed(test, reasons.get(test, ""), rehearsal)
    ]:
        where = "in a rehearsal" if rehearsal else "on a GPU run"
        return False, f"FAIL: {text}; not a skip by design {where}: {'; '.join(refused)}"
    if good == 0:
        return False, f"FAIL: nothing passed: {text}"
    if rehearsal:
        return True, f"ok (rehearsal: CUDA tests skipped, no GPU): {text}"
    by_design = f"; {skipped} skipped by design" if skipped else ""
    return True, f"ok ({shown}{by_design}): {text}"


def judge_with_warnings(rc: int, log: Path) -> Verdict:
    lines = log.read_text(encoding="utf-8").splitlines()
    warnings = [line.strip() for line in lines if line.startswith(("WARNING: ", "FAIL: "))]
    return rc == 0, "; ".join(["ok" if rc == 0 else f"FAIL: exit {rc}", *warnings])


def judge_bench(json_path: Path, rc: int, _log: Path) -> Verdict:
    if rc != 0 or not json_path.is_file():
        return False, f"FAIL: exit {rc}"
    data = json.loads(json_path.read_text(encoding="utf-8"))
    ratio, delta = data["ratio"], data["delta_ms"]
    return True, (
        f"patched/unpatched {ratio['median']:.3f} (runs {ratio['min']:.3f}.."
        f"{ratio['max']:.3f}); +{delta['median'] * 1e3:.1f} us/iteration; the wait "
        f"{data['wait_us']['median']:.1f} us, idle gap {data['idle_gap_us']['added']:.1f} us"
    )


def exit_code(outcomes: list[Outcome]) -> Exit:
    if failed := [o for o in outcomes if not o.ok]:
        return Exit.SETUP if any(o.kind == SETUP for o in failed) else Exit.TESTS_FAILED
    return Exit.OK


def summary_table(outcomes: list[Outcome]) -> str:
    rows = [(o.stage, o.result, f"{o.seconds:.1f} s") for o in outcomes]
    return textout.table(("stage", "result", "time"), rows, markdown=True)


def run_all(
    stages: list[Stage], reports: Path, end: float | None = None, figures: Figures | None = None
) -> Exit:
    """Run the stages; print and store the summary, figures() below it; the run's exit code."""
    reports.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    for stage in stages:
        try:
            outcome = run_stage(stage, {o.stage for o in outcomes if o.ok}, reports, end)
        except Exception as err:  # a bug of ours fails this stage, not the whole run
            traceback.print_exc()
            outcome = Outcome(stage.name, False, f"FAIL: internal error: {err!r}", 0.0, stage.kind)
        outcomes.append(outcome)
    table, code = summary_table(outcomes), exit_code(outcomes)
    measured = ""
    if figures is not None:
        try:
            measured = f"\n{figures()}\n"
        except Exception as err:  # the stage table is kept; the error is said in its place
            traceback.print_exc()
            measured = f"\n## Figures\n\nnot read: {type(err).__name__}: {err}\n"
            code = Exit.INTERNAL if code == Exit.OK else code
    verdict = "all stages passed" if code == Exit.OK else "FAILED"
    print(f"\nci/run-gpu summary: {verdict}\n{table}\n{measured}", end="")
    report = f"## ci/run-gpu: {verdict}\n\n{table}\n{measured}"
    (reports / SUMMARY_FILE).write_text(report, encoding="utf-8")
    if step_summary := os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(step_summary, "a", encoding="utf-8") as out:
            out.write(report)
    return code
