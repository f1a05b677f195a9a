"""Tests here run once per step of the series: base, 0001, 0002.

scripts/run-tests puts that step's sglang tree first on PYTHONPATH and names
the step in SGLANG_BACKPORTS_STEP. A test that guards a fix says on which
steps it passes with @pytest.mark.pass_on(...); on every other step it is
turned into a strict xfail, so it must fail there, and the run fails if it
does not. Tests without the marker must pass on every step.
"""

from __future__ import annotations

import os

import pytest

STEPS = ("base", "0001", "0002")
STEP_ENV = "SGLANG_BACKPORTS_STEP"


def current_step() -> str:
    step = os.environ.get(STEP_ENV, "")
    if step not in STEPS:
        raise pytest.UsageError(
            f"{STEP_ENV} is {step!r}; run these tests through scripts/run-tests, "
            f"which sets it to one of {', '.join(STEPS)}"
        )
    return step


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pass_on(*steps): the steps on which this test passes; it must fail on the others",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    step = current_step()
    for item in items:
        marker = item.get_closest_marker("pass_on")
        if marker is None:
            continue
        unknown = set(marker.args) - set(STEPS)
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: unknown steps {sorted(unknown)}")
        if step not in marker.args:
            item.add_marker(
                pytest.mark.xfail(
                    strict=True,
                    reason=f"guards a fix that step {step} does not have "
                    f"(passes on {', '.join(marker.args)})",
                )
            )


@pytest.fixture(scope="session")
def step() -> str:
    """The step of the series whose sglang tree is under test."""
    return current_step()


@pytest.fixture(scope="session", autouse=True)
def _sglang_is_the_step_tree() -> None:
    """Refuse to test an sglang that is not the step's tree (e.g. site-packages)."""
    import sglang

    tree = os.environ.get("SGLANG_BACKPORTS_TREE")
    if tree and not os.path.realpath(sglang.__file__).startswith(os.path.realpath(tree)):
        raise RuntimeError(f"sglang was imported from {sglang.__file__}, not from {tree}")
