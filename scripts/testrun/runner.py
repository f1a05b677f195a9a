"""One pytest run per suite and per sglang tree (docs/testing.md), and their tables."""

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchset.lock import marked_folder, tmpdir
from patchset.manifest import Series
from patchset.paths import PROJECT_ROOT, build_dir
from patchset.textout import table

from .outcomes import OPTION, SEVERITY, read_outcomes
from .steps import PATCH_SET_ENV, STEP_ENV, TREE_ENV

SCRIPTS = PROJECT_ROOT / "scripts"
STEP_TESTS = PROJECT_ROOT / "test" / "steps"
TOOL_TESTS = PROJECT_ROOT / "test" / "tools"
NO_TESTS = 5  # pytest's exit code when it collected nothing
RUN_TEMP = "sglang-backports-run-tests-"
RAM_FOLDER = Path("/dev/shm")
RAM_NEEDED = 4 << 30  # test/tools leaves about 2 GB there at its end


def temp_parent() -> Path:
    """Where a run's temporary folder goes: a RAM-backed file system with room to spare
    (making and removing files there costs a fraction of the system time a disk does),
    unless TMPDIR names another place; else the usual temporary folder."""
    with contextlib.suppress(OSError, ValueError):
        room = os.statvfs(RAM_FOLDER)
        free = _available_memory()
        usable = "TMPDIR" not in os.environ and os.access(RAM_FOLDER, os.W_OK | os.X_OK)
        if usable and min(room.f_bavail * room.f_frsize, free) > RAM_NEEDED:
            return RAM_FOLDER
    return tmpdir()


def _available_memory() -> int:
    """What the kernel can hand out without swapping (page cache included), else free pages."""
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(eq=False)
class SuiteRun:
    """One pytest process: a suite, or the step suite against one step's tree."""

    label: str
    tests: Path  # the suite's folder
    env: dict[str, str]
    tree: Path | None = None
    results: Path = field(default_factory=lambda: build_dir() / "test-results")
    returncode: int | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.outcomes_file = self.results / f"{self.label}.json"
        self.log = self.results / f"{self.label}.log"

    def pytest_args(self, extra: Sequence[str]) -> list[str]:
        """Its arguments; an outcome file of an earlier run is removed first."""
        self.results.mkdir(parents=True, exist_ok=True)
        self.outcomes_file.unlink(missing_ok=True)
        junit = self.results / f"{self.label}.xml"
        return [str(self.tests), f"{OPTION}={self.outcomes_file}", f"--junitxml={junit}", *extra]

    def finish(self, returncode: int, seconds: float) -> None:
        self.returncode, self.seconds = returncode, seconds
        self.outcomes, self.properties = read_outcomes(self.outcomes_file)

    def verdict(self) -> str:
        counts = Counter(self.outcomes.values())
        summary = ", ".join(f"{n} {o}" for o in reversed(SEVERITY) if (n := counts[o]))
        took = f"in {self.seconds:.0f}s"
        if self.returncode == NO_TESTS:
            return f"FAILED: pytest exit 5, no test ran, {took}"
        status = "ok" if self.returncode == 0 else f"FAILED: pytest exit {self.returncode}"
        return f"{status} ({summary or 'no tests'}) {took}"


def step_run(label: str, series: Series, step: str, tree: Path) -> SuiteRun:
    """The step suite against tree, told the patch set, the step, and the tree under test."""
    env = {STEP_ENV: step, PATCH_SET_ENV: str(series.folder), TREE_ENV: str(tree)}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), str(SCRIPTS)])
    return SuiteRun(label, STEP_TESTS, env, tree)


def _start(command: list[str], log: Path, **extra: str) -> subprocess.Popen[bytes]:
    """command, its output into log, in this environment less what a step's run is told."""
    dropped = (STEP_ENV, PATCH_SET_ENV, TREE_ENV, "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in dropped} | extra
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=env, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def run_tools(python: Path, run: SuiteRun, extra: Sequence[str], workers: int) -> None:
    """pytest-xdist with `workers` (loadgroup: an xdist_group's tests share one worker)."""
    args = run.pytest_args(["-n", str(workers), "--dist", "loadgroup", *extra])
    started = time.monotonic()
    with marked_folder(temp_parent(), RUN_TEMP) as tmp:  # pytest's tmp_path and the rest
        tmp.chmod(0o711)  # a test runs a command as another user in a folder it makes here
        env = run.env | {"TMPDIR": str(tmp)}
        proc = _start([str(python), "-m", "pytest", *args], run.log, **env)
        run.finish(_wait([proc])[0], time.monotonic() - started)
    print(f"\n=== {run.label} (pytest exit {run.returncode}) ===")
    sys.stdout.write(run.log.read_text(encoding="utf-8", errors="replace"))


def _wait(procs: Sequence[subprocess.Popen[bytes]]) -> list[int]:
    """Their exit codes; interrupted, it ends those still running first: none outlives us."""
    try:
        return [proc.wait() for proc in procs]
    finally:
        running = [proc for proc in procs if proc.poll() is None]
        for proc in running:
            proc.terminate()
        for proc in running:
            proc.wait()


def run_forked(groups: dict[Path, list[SuiteRun]], extra: Sequence[str], parallel: int) -> None:
    """One testrun.worker per interpreter, all at once, sharing `parallel` forked children
    (one each at least): one environment's imports overlap another's runs."""
    groups = {python: runs for python, runs in groups.items() if runs}
    if not groups:
        return
    with marked_folder(temp_parent(), RUN_TEMP) as tmp:
        workers: list[tuple[subprocess.Popen[bytes], Path]] = []
        ends: dict[SuiteRun, Path] = {}
        for g, (python, runs) in enumerate(groups.items()):
            jobs = []
            for run in runs:
                ends[run] = Path(tmp) / f"{g}-{len(ends)}.json"
                job = dict(label=run.label, args=run.pytest_args(extra), env=run.env)
                jobs.append(job | dict(tree=str(run.tree), log=str(run.log), result=str(ends[run])))
            jobs_file = Path(tmp) / f"jobs-{g}.json"
            parallel_here = max(1, parallel // len(groups))
            jobs_file.write_text(json.dumps({"parallel": parallel_here, "runs": jobs}), "utf-8")
            log = runs[0].results / f"worker-{g + 1}.log"
            command = [str(python), "-m", "testrun.worker", str(jobs_file)]
            # TMPDIR in the run's folder: what torch and pytest put there goes too, even on a signal
            workers.append((_start(command, log, PYTHONPATH=str(SCRIPTS), TMPDIR=str(tmp)), log))
        _wait([proc for proc, _log in workers])
        for _proc, log in workers:
            sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
        for run, result in ends.items():
            data = {"returncode": -1, "seconds": 0.0}
            if result.is_file():
                data = json.loads(result.read_text(encoding="utf-8"))
            run.finish(data["returncode"], data["seconds"])


def step_table(runs: Sequence[SuiteRun], headers: Sequence[str], prefix: str = "") -> str:
    """test | one column per step run, each test's outcome on that step; with prefix,
    race scenario | the properties recorded as prefix + scenario ("" when none)."""
    cells = [r.outcomes for r in runs]
    if prefix:
        cells = [
            {k[len(prefix) :]: v for k, v in r.properties.items() if k.startswith(prefix)}
            for r in runs
        ]
    # The last step usually holds every test; its order is pytest's collection order.
    rows = list(dict.fromkeys(n for c in reversed(cells) for n in c))
    if not rows:
        return "" if prefix else "(no step test ran)"
    rows, title = (sorted(rows), "race scenario") if prefix else (rows, "test")
    return table([title, *headers], [[n, *(c.get(n, "-") for c in cells)] for n in rows])
