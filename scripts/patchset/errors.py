"""Refusals with an exit code, a message that names the problem, and a next step."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """Exit codes shared by every command in scripts/."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    DIRTY_TREE = 3
    BASE_MISMATCH = 4
    ALREADY_UPSTREAM = 5
    PATCHSET_INVALID = 6
    NOT_A_CHECKOUT = 7
    WHEEL_HASH = 8
    WHEEL_UNAVAILABLE = 9
    APPLY_FAILED = 10
    WOULD_NOT_APPLY = 11
    BRANCH_EXISTS = 12
    STALE = 13


EXIT_HELP = """\
exit codes:
   0  done: the series was applied, was already applied, or (--check) applies cleanly
   1  internal error (a bug in this tool; please report it with the output)
   2  bad command-line usage
   3  the sglang work tree has uncommitted changes to tracked files
   4  the base's files do not match the pin manifest (not sglang {version})
   5  the base already contains the fixes (sglang 0.5.19 or later): no patch is needed
   6  the patch set is damaged: a patch file or the series does not match the manifest
   7  the given path is not a git checkout
   8  the downloaded or cached wheel's sha256 does not match the manifest
   9  the wheel could not be downloaded and is not in the cache
  10  a patch failed to apply; everything this run changed was rolled back
  11  (--check) at least one patch would not apply cleanly
  12  the target branch already exists and holds something else
  13  stale: (export-patches --check) the committed patch set differs from a fresh
      export; (review --strict) a difference from upstream has no explanation
"""


class PatchSetError(Exception):
    """A refusal: what is wrong and what to do next, with its exit code."""

    def __init__(self, code: Exit, problem: str, next_step: str = "") -> None:
        super().__init__(problem)
        self.code = code
        self.problem = problem
        self.next_step = next_step

    def __str__(self) -> str:
        if self.next_step:
            return f"{self.problem}\nnext step: {self.next_step}"
        return self.problem
