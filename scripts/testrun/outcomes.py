"""A pytest plugin: --outcomes-json FILE gets {"outcomes": {test: outcome}, "properties": {..}}.
Each outcome is decided where the test ran and carried on its report: under pytest-xdist the
controller, which runs no test, writes FILE."""

import json
from collections.abc import Generator
from pathlib import Path

import pytest

PASS = "pass"
EXPECTED_FAIL = "FAIL (expected)"
SKIP = "skip"
FAIL = "FAIL"
UNEXPECTED_PASS = "PASS (must fail)"
ERROR = "ERROR"
# Worst first: a test with several reports (a teardown error) shows the worst.
SEVERITY = (ERROR, UNEXPECTED_PASS, FAIL, SKIP, EXPECTED_FAIL, PASS)
OPTION = "--outcomes-json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="FILE", help="write each test's outcome to FILE as JSON")


def _outcome(item: pytest.Item, call: pytest.CallInfo[None], rep: pytest.TestReport) -> str:
    if rep.when != "call":
        return ERROR if rep.failed else SKIP if rep.skipped and rep.when == "setup" else ""
    if rep.failed and call.excinfo is None and item.get_closest_marker("xfail") is not None:
        return UNEXPECTED_PASS
    if rep.failed:
        return FAIL
    if rep.skipped:
        return EXPECTED_FAIL if hasattr(rep, "wasxfail") else SKIP
    return PASS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """Where the test runs: its outcome, as an attribute that xdist carries to the controller."""
    report = yield
    rep: pytest.TestReport = report.get_result()  # type: ignore[attr-defined]
    rep.testrun_outcome = _outcome(item, call, rep)  # type: ignore[attr-defined]


class _Recorder:
    """In the process that writes the file: every report's outcome and properties."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.outcomes: dict[str, str] = {}
        self.properties: dict[str, str] = {}

    def record(self, nodeid: str, outcome: str) -> None:
        path, _, rest = nodeid.partition("::")
        name = f"{Path(path).stem}::{rest}"  # tools/test_x.py::test_y[p] -> test_x::test_y[p]
        self.outcomes[name] = min(outcome, self.outcomes.get(name, outcome), key=SEVERITY.index)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.properties.update((str(name), str(value)) for name, value in report.user_properties)
        if outcome := getattr(report, "testrun_outcome", ""):
            self.record(report.nodeid, outcome)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.record(f"{report.nodeid}::(collection)", ERROR)

    def pytest_sessionfinish(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        data = {"outcomes": self.outcomes, "properties": self.properties}
        self.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption(OPTION)
    if out and not hasattr(config, "workerinput"):  # an xdist worker reports to its controller
        config.pluginmanager.register(_Recorder(Path(out)), "testrun-outcomes")


def read_outcomes(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(test -> outcome, property -> value) from a file the plugin wrote; empty if none."""
    if not path.is_file():
        return {}, {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data["outcomes"]), dict(data["properties"])
