"""One pytest run per suite and per sglang tree, and the tables of their outcomes.

test/tools runs in a few processes of its own (its files split so that each
piece takes about as long, by the times of the last run). test/steps runs once per step
of every series under test; those runs go to testrun.worker, which forks a
child per tree, so a module imported for one tree never leaks into another and
each tree pays only for its own sglang. Under forkservers() every one of these
processes is itself forked from a server that has imported the heavy
third-party modules once (testrun.forkserver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from patchset.manifest import Series
from patchset.paths import PROJECT_ROOT
from patchset.textout import table

from . import forkserver
from .outcomes import OPTION, SEVERITY, read_outcomes
from .steps import PATCH_SET_ENV, STEP_ENV, TREE_ENV

SCRIPTS = PROJECT_ROOT / "scripts"
STEP_TESTS = PROJECT_ROOT / "test" / "steps"
TOOL_TESTS = PROJECT_ROOT / "test" / "tools"
NO_TESTS = 5  # pytest's exit code when it collected nothing
# test/tools files kept in one piece, so that what they share is made once: the
# session's own build tree and its step trees, our wheel and what pip installs
# from it; torch, imported in the process.
TOGETHER = (
    ("test_racecheck_command", "test_racecheck_writers", "test_run_tests", "test_check_install"),
    ("test_gpu_bench", "test_gpu_wheelhouse", "test_racecheck_selftest"),
)


@dataclass(eq=False)
class SuiteRun:
    """One pytest process: a suite, or the step suite against one step's tree."""

    label: str
    tests: Path | list[Path]  # a folder, or the test files of a piece of one
    results: Path  # the folder for this run's outcomes and log
    env: dict[str, str]
    tree: Path | None = None
    returncode: int | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def outcomes_file(self) -> Path:
        return self.results / f"{self.label}.json"

    @property
    def log(self) -> Path:
        return self.results / f"{self.label}.log"

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def pytest_args(self, extra: Sequence[str]) -> list[str]:
        tests = self.tests if isinstance(self.tests, list) else [self.tests]
        return [
            *map(str, tests),
            f"{OPTION}={self.outcomes_file}",
            f"--junitxml={self.results / f'{self.label}.xml'}",
            *extra,
        ]

    def collect(self) -> None:
        self.outcomes, self.properties = read_outcomes(self.outcomes_file)

    def verdict(self) -> str:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {o}" for o in reversed(SEVERITY) if (n := counts.get(o)))
        took = f"in {self.seconds:.0f}s"
        if self.returncode == NO_TESTS:
            return f"FAILED: pytest exit 5, no test ran, {took}"
        status = "ok" if self.returncode == 0 else f"FAILED: pytest exit {self.returncode}"
        return f"{status} ({summary or 'no tests'}) {took}"


def tool_pieces(results: Path, count: int, kept: Path | None = None) -> list[SuiteRun]:
    """test/tools as count runs of about equal length ("tools" alone when count is 1).

    Each file weighs what its tests took in this checkout's last run
    (build/test-results/tools*.xml); in a checkout without one, what they took
    in the last run on this machine (kept, a file that keep_tool_seconds
    wrote); else its size in bytes. The heaviest file goes to the lightest
    piece, in turn. A file's tests stay together, so its module fixtures are
    made once, and so do the files of each TOGETHER group.
    """
    files = sorted(TOOL_TESTS.glob("test_*.py"))
    if count <= 1 or len(files) <= 1:
        return [SuiteRun("tools", TOOL_TESTS, results, {})]
    last = file_seconds(results.glob("tools*.xml")) or _kept_seconds(kept)
    scale = max(last.values(), default=1.0) / max(f.stat().st_size for f in files)
    grouped = {stem for group in TOGETHER for stem in group}
    units = [[f] for f in files if f.stem not in grouped]
    units += [[f for f in files if f.stem in group] for group in TOGETHER]
    weight = {f: last.get(f.stem, f.stat().st_size * scale) for f in files}
    pieces: list[list[Path]] = [[] for _ in range(min(count, len(units)))]
    loads = [0.0] * len(pieces)
    for unit in sorted(units, key=lambda u: -sum(weight[f] for f in u)):
        lightest = loads.index(min(loads))
        pieces[lightest] += unit
        loads[lightest] += sum(weight[f] for f in unit)
    return [
        SuiteRun(f"tools-{n}", sorted(piece), results, {})
        for n, piece in enumerate(pieces, 1)
        if piece
    ]


def keep_tool_seconds(results: Path, kept: Path) -> None:
    """Keep the tools' per-file times of this run in kept (in the cache folder),
    so that a fresh clone on this machine shares its first pieces out by them.
    Only a hint: a folder that cannot be written is left as it is."""
    seconds = file_seconds(results.glob("tools*.xml"))
    if not seconds:
        return
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        part = kept.with_name(f"{kept.name}.{os.getpid()}.part")
        part.write_text(json.dumps(seconds, indent=1, sort_keys=True), encoding="utf-8")
        part.replace(kept)
    except OSError:
        return


def _kept_seconds(kept: Path | None) -> dict[str, float]:
    try:
        data = json.loads(kept.read_text(encoding="utf-8")) if kept else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}


def file_seconds(xml_files: Iterable[Path]) -> dict[str, float]:
    """test module name -> seconds its tests took, from JUnit XML files.

    A module found in several files takes the newest file's figure; an
    unreadable file is skipped.
    """
    seconds: dict[str, float] = {}
    for xml in sorted(xml_files, key=lambda f: f.stat().st_mtime):
        in_file: dict[str, float] = {}
        try:
            for case in ElementTree.parse(xml).iter("testcase"):
                module = case.get("classname", "").split(".")[-1]
                in_file[module] = in_file.get(module, 0.0) + float(case.get("time", 0.0))
        except (OSError, ElementTree.ParseError, ValueError):
            continue
        seconds |= in_file
    return seconds


def step_env(series: Series, step: str, tree: Path) -> dict[str, str]:
    """What a step's run is told: the patch set, the step, and the tree under test."""
    return {
        STEP_ENV: step,
        PATCH_SET_ENV: str(series.folder),
        TREE_ENV: str(tree),
        "PYTHONPATH": os.pathsep.join([str(tree / "python"), str(SCRIPTS)]),
    }


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in (STEP_ENV, PATCH_SET_ENV, TREE_ENV, "PYTHONPATH"):
        env.pop(name, None)
    return env


def _worker_env() -> dict[str, str]:
    return _clean_env() | {"PYTHONPATH": str(SCRIPTS)}


def forkservers(pythons: Sequence[Path], results: Path) -> AbstractContextManager[None]:
    """testrun.forkserver.serving for these interpreters, with the workers' environment."""
    return forkserver.serving(pythons, _worker_env(), results)


def _start_suite(python: Path, run: SuiteRun, extra: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start pytest on run.tests in a process of its own, its output going to run.log."""
    run.results.mkdir(parents=True, exist_ok=True)
    run.outcomes_file.unlink(missing_ok=True)
    env = _clean_env() | run.env
    with run.log.open("wb") as log:
        return subprocess.Popen(
            forkserver.command(python, "pytest", run.pytest_args(extra), env),
            env=env,
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def run_suites(python: Path, runs: Sequence[SuiteRun], extra: Sequence[str]) -> None:
    """Run each in a pytest process of its own, all at once; fill in the results.

    Each run's time is until it ended, not until it was waited for; the logs
    are printed in order once all have ended.
    """
    started = time.monotonic()
    running = {run: _start_suite(python, run, extra) for run in runs}
    while running:
        for run, proc in list(running.items()):
            if proc.poll() is not None:
                run.returncode = proc.returncode
                run.seconds = time.monotonic() - started
                del running[run]
        time.sleep(0.2)
    for run in runs:
        run.collect()
        print(f"\n=== {run.label} (pytest exit {run.returncode}) ===")
        sys.stdout.write(run.log.read_text(encoding="utf-8", errors="replace"))


def run_forked(
    groups: Sequence[tuple[Path, Sequence[SuiteRun]]], extra: Sequence[str], parallel: int = 2
) -> None:
    """Run the step runs: one testrun.worker per interpreter, all workers at once.

    Each worker imports torch and the rest (or, forked from a fork server,
    finds them imported), then forks its runs; the workers
    share `parallel` children at a time between them (at least one each), so
    one environment's imports overlap another's runs. Their output goes to
    build/test-results/worker-N.log and is printed, worker by worker, at the end.
    """
    groups = [(python, runs) for python, runs in groups if runs]
    if not groups:
        return
    each = max(1, parallel // len(groups))
    with tempfile.TemporaryDirectory(prefix="run-tests-") as tmp:
        workers = []
        for g, (python, runs) in enumerate(groups):
            for run in runs:
                run.results.mkdir(parents=True, exist_ok=True)
                run.outcomes_file.unlink(missing_ok=True)
            jobs = {
                "parallel": each,
                "runs": [
                    {
                        "label": run.label,
                        "args": run.pytest_args(extra),
                        "env": run.env,
                        "tree": str(run.tree),
                        "log": str(run.log),
                        "result": str(Path(tmp) / f"{g}-{n}.json"),
                    }
                    for n, run in enumerate(runs)
                ],
            }
            jobs_file = Path(tmp) / f"jobs-{g}.json"
            jobs_file.write_text(json.dumps(jobs), encoding="utf-8")
            log = runs[0].results / f"worker-{g + 1}.log"
            env = _worker_env()
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    forkserver.command(python, "testrun.worker", [str(jobs_file)], env),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            workers.append((proc, log))
        for proc, log in workers:
            proc.wait()
            sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
        for g, (_python, runs) in enumerate(groups):
            for n, run in enumerate(runs):
                result = Path(tmp) / f"{g}-{n}.json"
                if result.is_file():
                    data = json.loads(result.read_text(encoding="utf-8"))
                    run.returncode, run.seconds = data["returncode"], data["seconds"]
                else:
                    run.returncode = -1
                run.collect()


def step_table(runs: Sequence[SuiteRun], headers: Sequence[str]) -> str:
    """test | one column per step run, with each test's outcome on that step."""
    # The last step usually holds every test; its order is pytest's collection order.
    names: list[str] = []
    for run in reversed(runs):
        names += [n for n in run.outcomes if n not in names]
    if not names:
        return "(no step test ran)"
    return table(["test", *headers], [[n, *(r.outcomes.get(n, "-") for r in runs)] for n in names])


def property_table(
    runs: Sequence[SuiteRun], headers: Sequence[str], prefix: str, title: str
) -> str:
    """title | one column per step run, from the recorded properties named prefix + row."""
    cells = [
        {k.removeprefix(prefix): v for k, v in r.properties.items() if k.startswith(prefix)}
        for r in runs
    ]
    rows = sorted({row for per_run in cells for row in per_run})
    if not rows:
        return ""
    return table([title, *headers], [[row, *(c.get(row, "-") for c in cells)] for row in rows])
