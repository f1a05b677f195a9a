"""Tests here run once per step of a series (a base release's tree, then one per patch).

scripts/run-tests puts that step's sglang tree first on the import path and
names, in the environment, the patch set (SGLANG_BACKPORTS_PATCH_SET) and the
step (SGLANG_BACKPORTS_STEP). What each step holds comes from the patch set's
pin.toml ([step-fixes]), so the same tests judge every base: a test that
guards a fix says on which steps it passes with @pytest.mark.pass_on(...),
naming fixes ("fix-b") or their absence ("!fix-a"); on every other step it
becomes a strict xfail that only an AssertionError satisfies, so a crash is
never taken for the expected failure. Tests without the marker must pass on
every step.
"""

from __future__ import annotations

import os

import pytest
from testrun.steps import TREE_ENV, StepError, StepUnderTest, load_step


def _load() -> StepUnderTest:
    try:
        return load_step()
    except StepError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    step = _load()
    known = set(step.series.manifest.registry.fixes)
    for item in items:
        marker = item.get_closest_marker("pass_on")
        if marker is None:
            continue
        unknown = {c.lstrip("!") for c in marker.args} - known
        if unknown or not marker.args:
            raise pytest.UsageError(f"{item.nodeid}: pass_on names unknown fixes {sorted(unknown)}")
        if not any(step.holds(c) for c in marker.args):
            item.add_marker(
                pytest.mark.xfail(
                    strict=True,
                    raises=AssertionError,
                    reason=f"guards a fix: passes where {' or '.join(marker.args)}; "
                    f"step {step.name} holds {sorted(step.fixes) or 'no fix'}",
                )
            )


@pytest.fixture(scope="session")
def step() -> StepUnderTest:
    """The step of the series whose sglang tree is under test."""
    return _load()


@pytest.fixture(scope="session", autouse=True)
def _sglang_is_the_step_tree() -> None:
    """Refuse to test an sglang that is not the step's tree (e.g. site-packages)."""
    import sglang

    tree = os.environ.get(TREE_ENV)
    if tree and not os.path.realpath(sglang.__file__).startswith(os.path.realpath(tree)):
        raise RuntimeError(f"sglang was imported from {sglang.__file__}, not from {tree}")
