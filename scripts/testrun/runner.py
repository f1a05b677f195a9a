"""The test command's library: the venv, one pytest run per suite and step, the table.

test/tools runs once. test/steps runs once per step of the series, each in its
own process with that step's sglang tree first on PYTHONPATH, so a module
imported in one step can never leak into another.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.paths import PROJECT_ROOT

REQUIREMENTS = (
    PROJECT_ROOT / "requirements" / "cpu.txt",
    PROJECT_ROOT / "requirements" / "test.txt",
)
STEP_TESTS = PROJECT_ROOT / "test" / "steps"
TOOL_TESTS = PROJECT_ROOT / "test" / "tools"
STAMP_NAME = "requirements.sha256"
PYTHON_VERSION = (3, 11)
# The step an arbitrary tree given with --tree is judged as: the whole series.
FINAL_STEP = "0002"
STEP_ENV = "SGLANG_BACKPORTS_STEP"
TREE_ENV = "SGLANG_BACKPORTS_TREE"
NO_TESTS = 5  # pytest's exit code when it collected nothing

PASS = "pass"
EXPECTED_FAIL = "FAIL (expected)"
SKIP = "skip"
FAIL = "FAIL"
UNEXPECTED_PASS = "PASS (must fail)"
ERROR = "ERROR"
# Worst first: a test with several junit entries (a teardown error) shows the worst.
_SEVERITY = (ERROR, UNEXPECTED_PASS, FAIL, SKIP, EXPECTED_FAIL, PASS)


def check_interpreter() -> None:
    if sys.version_info[:2] != PYTHON_VERSION:
        wanted = ".".join(map(str, PYTHON_VERSION))
        raise BackportError(
            Exit.SETUP,
            f"this is Python {sys.version.split()[0]}; the pinned sglang wheel and "
            f"the requirements are for Python {wanted}",
            f"run it as python{wanted} scripts/run-tests",
        )


def requirements_digest(files: Sequence[Path]) -> str:
    """What the venv was made from: the requirement files and the Python version."""
    digest = hashlib.sha256()
    digest.update(f"python {sys.version_info.major}.{sys.version_info.minor}\n".encode())
    for path in files:
        digest.update(f"{path.name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path, requirements: Sequence[Path] = REQUIREMENTS) -> bool:
    """Make venv hold exactly the requirements; False when its stamp says it already does."""
    missing = [str(p) for p in requirements if not p.is_file()]
    if missing:
        raise BackportError(
            Exit.SETUP,
            f"requirement files missing: {', '.join(missing)}",
            "restore them from git (they are part of the project)",
        )
    stamp = venv / STAMP_NAME
    wanted = requirements_digest(requirements)
    if venv_python(venv).exists() and stamp.is_file() and stamp.read_text().strip() == wanted:
        return False
    # Start empty so that nothing from an older set of requirements stays behind.
    _run_setup([sys.executable, "-m", "venv", "--clear", str(venv)], "python -m venv")
    install = [str(venv_python(venv)), "-m", "pip", "install", "--no-input"]
    install += ["--disable-pip-version-check"]
    for path in requirements:
        install += ["-r", str(path)]
    _run_setup(install, "pip install")
    stamp.write_text(wanted + "\n")
    return True


def _run_setup(command: list[str], what: str) -> None:
    print(f"$ {' '.join(command)}", flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        raise BackportError(
            Exit.SETUP,
            f"{what} failed with exit code {result.returncode} (its output is above)",
            "fix what it names (often the network or the package index) and run "
            "again; the venv is rebuilt until one install succeeds",
        )


@dataclass
class SuiteRun:
    """One pytest process: a suite, or the step suite against one step's tree."""

    label: str
    tests: Path
    junit: Path
    env: dict[str, str]
    returncode: int | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def verdict(self) -> str:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {o}" for o in reversed(_SEVERITY) if (n := counts.get(o)))
        took = f"in {self.seconds:.0f}s"
        if self.returncode == NO_TESTS:
            return f"FAILED: pytest exit 5, no test ran, {took}"
        status = "ok" if self.returncode == 0 else f"FAILED: pytest exit {self.returncode}"
        return f"{status} ({summary or 'no tests'}) {took}"


def step_env(step: str, tree: Path) -> dict[str, str]:
    """The environment for one step's run: its tree's python/ first on the import path."""
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), *([rest] if rest else [])])
    env[STEP_ENV] = step
    env[TREE_ENV] = str(tree)
    return env


def tools_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(STEP_ENV, None)
    env.pop(TREE_ENV, None)
    return env


def check_tree(tree: Path) -> Path:
    """A tree given with --tree must hold python/sglang, as a checkout or the build tree does."""
    tree = tree.resolve()
    if not (tree / "python" / "sglang" / "__init__.py").is_file():
        raise BackportError(
            Exit.SETUP,
            f"{tree} holds no python/sglang/__init__.py",
            "pass the folder that contains python/sglang (an sglang checkout, "
            "or build/steps/<step>)",
        )
    return tree


def run_suite(python: Path, run: SuiteRun, extra: Sequence[str]) -> SuiteRun:
    """Run pytest on run.tests; fills in the exit code and the outcome of each test."""
    run.junit.parent.mkdir(parents=True, exist_ok=True)
    run.junit.unlink(missing_ok=True)
    command = [
        str(python), "-m", "pytest", str(run.tests),
        "--rootdir", str(PROJECT_ROOT),
        "-p", "no:cacheprovider",
        "-o", "junit_family=xunit1",
        f"--junitxml={run.junit}",
        "-rfEX", *extra,
    ]  # fmt: skip
    print(f"\n=== {run.label}: {run.tests.relative_to(PROJECT_ROOT)} ===", flush=True)
    start = time.monotonic()
    run.returncode = subprocess.run(command, env=run.env, cwd=PROJECT_ROOT).returncode
    run.seconds = time.monotonic() - start
    run.outcomes = read_junit(run.junit, run.tests) if run.junit.is_file() else {}
    return run


def _outcome(case: ET.Element) -> str:
    if case.find("error") is not None:
        return ERROR
    failure = case.find("failure")
    if failure is not None:
        return UNEXPECTED_PASS if "XPASS(strict)" in failure.get("message", "") else FAIL
    skipped = case.find("skipped")
    if skipped is not None:
        return EXPECTED_FAIL if skipped.get("type") == "pytest.xfail" else SKIP
    return PASS


def read_junit(junit: Path, tests: Path) -> dict[str, str]:
    """test name (module::[class::]function) -> outcome, from pytest's junit xml."""
    prefix = ".".join(tests.relative_to(PROJECT_ROOT).parts) + "."
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").removeprefix(prefix).replace(".", "::")
        name = f"{module}::{case.get('name', '')}"
        outcome = _outcome(case)
        previous = outcomes.get(name)
        if previous is None or _SEVERITY.index(outcome) < _SEVERITY.index(previous):
            outcomes[name] = outcome
    return outcomes


def read_properties(junit: Path, prefix: str) -> dict[str, str]:
    """Properties a test recorded with record_property whose name starts with prefix."""
    found: dict[str, str] = {}
    for prop in ET.parse(junit).iter("property"):
        name = prop.get("name", "")
        if name.startswith(prefix):
            found[name.removeprefix(prefix)] = prop.get("value", "")
    return found


def property_table(
    runs: Sequence[SuiteRun], headers: Sequence[str], prefix: str, title: str
) -> str:
    """title | one column per step run, from the properties named prefix + row."""
    cells = [read_properties(r.junit, prefix) if r.junit.is_file() else {} for r in runs]
    rows = sorted({row for per_run in cells for row in per_run})
    if not rows:
        return ""
    return _grid([[title, *headers], *([row, *(c.get(row, "-") for c in cells)] for row in rows)])


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def step_table(runs: Sequence[SuiteRun], headers: Sequence[str]) -> str:
    """test | one column per step run, with each test's outcome on that step."""
    # The last step usually holds every test; its order is pytest's collection order.
    names: list[str] = []
    for run in reversed(runs):
        names += [n for n in run.outcomes if n not in names]
    if not names:
        return "(no step test ran)"
    rows = [["test", *headers]]
    rows += [[name, *(run.outcomes.get(name, "-") for run in runs)] for name in names]
    return _grid(rows)
