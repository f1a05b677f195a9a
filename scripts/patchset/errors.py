"""The one error system: exit codes, a refusal with a next step, and their help text."""

import subprocess
from enum import IntEnum


class Exit(IntEnum):
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
    SETUP = 14
    RACE = 15
    ENVIRONMENT = 16
    SCENARIO = 17
    TESTS_FAILED = 18
    LOCKED = 19
    # check-install's verdicts: what an environment runs
    AFFECTED = 20
    PARTIAL_FIX = 21
    UNKNOWN_CONTENT = 22
    NOT_INSTALLED = 23
    MODIFIED = 24
    # check-install with a deployment's configuration (--launch-args, --server-info)
    EXPOSED = 25
    NOT_EXPOSED = 26
    AMBIGUOUS = 27
    EXPOSURE_UNKNOWN = 28
    INTERRUPTED = 130


# The general meaning of each code; a command may word its own codes more closely.
EXIT_TEXT: dict[Exit, str] = {
    Exit.OK: "done",
    Exit.INTERNAL: "internal error (a bug in this tool; please report it with the output)",
    Exit.USAGE: "bad command-line usage",
    Exit.DIRTY_TREE: "the sglang work tree has uncommitted changes to tracked files, "
    "or a merge, rebase or am is in progress there",
    Exit.BASE_MISMATCH: "the base's files match no release this project serves",
    Exit.ALREADY_UPSTREAM: "the base already contains the fixes (sglang 0.5.19 or later): "
    "no patch is needed",
    Exit.PATCHSET_INVALID: "the patch set is damaged: a patch file or the series does not "
    "match the manifest",
    Exit.NOT_A_CHECKOUT: "the given path is not a git checkout (or not its top folder), or "
    "a build tree this command did not make",
    Exit.WHEEL_HASH: "the downloaded or cached wheel's sha256 does not match the manifest",
    Exit.WHEEL_UNAVAILABLE: "the wheel could not be downloaded and is not in the cache",
    Exit.APPLY_FAILED: "a patch failed to apply; everything this run changed was rolled back",
    Exit.WOULD_NOT_APPLY: "(--check) at least one patch would not apply cleanly",
    Exit.BRANCH_EXISTS: "the target branch already exists and holds something else",
    Exit.STALE: "stale: the committed output differs from a fresh one",
    Exit.SETUP: "a test environment could not be set up (venv, pip, wheelhouse)",
    Exit.RACE: "a race in the patched or given tree, or the race table differs from "
    "the expected one",
    Exit.ENVIRONMENT: "the environment: a file or folder cannot be read or written (read-only, "
    "disk full, a file where a folder belongs), git failed, Python is older than 3.11 (3.10 for "
    "check-install), or a tool this command needs is missing or not as pinned",
    Exit.SCENARIO: "a race scenario could not run on the tree (import failed or the sglang "
    "API differs)",
    Exit.TESTS_FAILED: "a test run failed or ran no test",
    Exit.LOCKED: "another run holds the lock on the same target; it is named",
    Exit.AFFECTED: "the environment runs an unpatched sglang with the race open",
    Exit.PARTIAL_FIX: "the environment runs fix A only: a race is still open",
    Exit.UNKNOWN_CONTENT: "the files match no release and no series this project knows",
    Exit.NOT_INSTALLED: "that interpreter finds no sglang",
    Exit.MODIFIED: "the files differ from the installed distribution's RECORD",
    Exit.EXPOSED: "an affected or partly fixed install, and this configuration reaches "
    "the race (the scenarios and buffers are named)",
    Exit.NOT_EXPOSED: "an affected or partly fixed install, but this configuration does not "
    "reach the race (the setting that keeps it out is named)",
    Exit.AMBIGUOUS: "two or more distributions that install sglang are installed where that "
    "interpreter looks: which one owns the files depends on the order of sys.path",
    Exit.EXPOSURE_UNKNOWN: "configuration not understood: exposure unknown (what could not "
    "be read is named; never taken as safe)",
    Exit.INTERRUPTED: "interrupted (Ctrl-C or a signal); what this run made was removed",
}

COMMON = (Exit.OK, Exit.INTERNAL, Exit.USAGE, Exit.ENVIRONMENT, Exit.INTERRUPTED)


class BackportError(Exception):
    """A refusal: what is wrong and what to do next, with its exit code."""

    def __init__(self, code: Exit, problem: str, next_step: str = "") -> None:
        super().__init__(problem)
        self.code = code
        self.problem = problem
        self.next_step = next_step

    def __str__(self) -> str:
        return f"{self.problem}\nnext step: {self.next_step}" if self.next_step else self.problem


class GitError(RuntimeError):
    """A git command that had to succeed did not; cli.run maps it to an exit code."""

    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]):
        detail = (result.stderr or result.stdout or "").strip() or f"exit {result.returncode}"
        super().__init__(f"git {' '.join(args)} failed: {detail}")
