"""The step a test/steps run judges, named in the environment by scripts/run-tests; what it
holds comes from pin.toml's [step-fixes]."""

import os
from dataclasses import dataclass
from pathlib import Path

from patchset.manifest import Series

STEP_ENV = "SGLANG_BACKPORTS_STEP"
PATCH_SET_ENV = "SGLANG_BACKPORTS_PATCH_SET"
TREE_ENV = "SGLANG_BACKPORTS_TREE"


class StepError(Exception):
    """The environment names no step, or one the patch set does not have."""


@dataclass(frozen=True)
class StepUnderTest:
    series: Series
    name: str
    fixes: frozenset[str]

    @property
    def is_final(self) -> bool:
        return self.name == self.series.manifest.final_step

    def holds(self, condition: str) -> bool:
        if condition.startswith("!"):
            return condition[1:] not in self.fixes
        return condition in self.fixes


def load_step() -> StepUnderTest:
    folder, name = os.environ.get(PATCH_SET_ENV, ""), os.environ.get(STEP_ENV, "")
    if not folder or not name:
        raise StepError(
            f"{PATCH_SET_ENV} and {STEP_ENV} are not set; run these tests through "
            "scripts/run-tests, which sets them for each step"
        )
    series = Series.load(Path(folder))
    if name not in series.manifest.steps:
        raise StepError(
            f"{STEP_ENV}={name!r} is not a step of {folder} "
            f"(steps: {', '.join(series.manifest.steps)})"
        )
    return StepUnderTest(series, name, series.manifest.step_fixes[name])
