"""What every command shares: its parser, its exit codes, and the one error wrapper."""

import argparse

# Imported now, while the launcher holds SIGINT, not on first use mid-run
# (weakref.finalize imports atexit; zipfile decodes old member names with cp437):
# a Ctrl-C inside a late import prints an "Exception ignored" traceback.
import atexit  # noqa: F401
import encodings.cp437  # noqa: F401
import errno
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import COMMON, EXIT_TEXT, BackportError, Exit, GitError
from .paths import DEFAULT_BASE, DEFAULT_PATCH_DIR

INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # the signals that end a run


def parser(
    prog: str, description: str, codes: Iterable[Exit], wording: dict[Exit, str], epilog: str = ""
) -> argparse.ArgumentParser:
    """A parser whose --help ends with the exit codes this command can return, and only those."""
    wording = {**EXIT_TEXT, **wording}
    lines = [*([epilog] if epilog else []), "exit codes:"]
    for code in sorted(set(codes) | set(COMMON)):
        at = f"  {int(code):>3}  "
        lines.append(textwrap.fill(wording[code], 79, initial_indent=at, subsequent_indent=" " * 7))
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="\n".join(lines) + "\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def absolute_path(text: str) -> Path:
    """argparse type: a path made absolute at once, so a later chdir cannot change it."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text).expanduser().absolute()


def seconds(text: str) -> float:
    """argparse type: a number of seconds, more than 0 and less than a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds between 0 and 86400")
    return value


def add_patch_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--patch-set",
        type=absolute_path,
        default=DEFAULT_PATCH_DIR,
        metavar="DIR",
        help=f"patch set folder (default: patches/sglang-{DEFAULT_BASE})",
    )


_ELSEWHERE = "SGLANG_BACKPORTS_BUILD or SGLANG_BACKPORTS_CACHE"
_OS_NEXT_STEP = {
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT), "free some disk space there and run again"),
    errno.EROFS: f"make that folder writable, or point {_ELSEWHERE} at a writable folder, "
    "and run again",
    errno.EACCES: "make that path readable and writable for this user, or point "
    f"{_ELSEWHERE} elsewhere, and run again",
    errno.EPERM: f"make that path writable for this user, or point {_ELSEWHERE} elsewhere, "
    "and run again",
    errno.ENOTDIR: "a file stands where a folder belongs: move it aside and run again",
    errno.EEXIST: "move that path aside and run again",
}


def describe_os_error(err: OSError) -> BackportError:
    where = " ".join(f"'{name}'" for name in (err.filename, err.filename2) if name)
    reason = err.strerror or str(err)
    problem = f"cannot use {where}: {reason}" if where else f"a system call failed: {reason}"
    next_step = _OS_NEXT_STEP.get(err.errno or 0, "fix what the message names and run again")
    return BackportError(Exit.ENVIRONMENT, problem, next_step)


def hold_interrupts() -> None:
    """A run at its end: a later signal stays pending, so it exits as what it did says."""
    signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)


def release_interrupts() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so every cleanup on the way runs; the name is
    kept apart too (raised inside a codec, the interrupt's text becomes the codec's)."""
    _SIGNALLED.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(_SIGNALLED[-1])


_SIGNALLED: list[str] = []


REMOVED = "what this run made was removed"


def report(err: BackportError) -> int:
    print(f"error: {err}", file=sys.stderr, flush=True)
    return int(err.code)


def run(main: Callable[[], int]) -> None:
    """Call main and exit: refusals, OS and git failures become a message and their code."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)
    try:
        code = int(main())
    except BackportError as err:
        code = report(err)
    except GitError as err:
        next_step = "check that git works in that folder (`git status` there) and run again"
        code = report(BackportError(Exit.ENVIRONMENT, str(err), f"{next_step}; {REMOVED}"))
    except OSError as err:
        code = report(describe_os_error(err))
    except KeyboardInterrupt:
        print(f"interrupted ({(_SIGNALLED or ['SIGINT'])[-1]}); {REMOVED}", file=sys.stderr)
        code = Exit.INTERRUPTED
    except Exception:
        traceback.print_exc()
        sys.stderr.write("error: internal error (the trace above); nothing of yours was reset\n")
        code = Exit.INTERNAL
    # The outcome is settled: a signal from now on would only kill the interpreter
    # while it shuts down, turning a finished run into a silent death by SIGINT.
    hold_interrupts()
    sys.stdout.flush()
    sys.exit(int(code))
