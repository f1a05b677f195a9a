"""One run at a time per target, and no half-made state on an interruption.

A target (the build folder, a user's repository) is guarded by an advisory
fcntl lock on a file next to it. The lock file names its holder so a refused
run can say who it waits for; it is removed when the holder is done, and the
OS drops the lock itself when a holder is killed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import BackportError, Exit

# hold_interrupts and release_interrupts live in interrupts.py (cli.py needs them
# without the locks); apply, run-tests and the tests take them from here too
from .interrupts import INTERRUPTS, hold_interrupts, release_interrupts  # noqa: F401

# How long a second run waits for the first by default (--wait changes it).
DEFAULT_WAIT_S = 30.0
# The fds of the locks this process holds. Every git we start inherits them, so
# a git that outlives a killed run still holds the lock until it ends.
_held: list[int] = []


def held_fds() -> tuple[int, ...]:
    return tuple(_held)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends.

    A git command killed half-way can leave a lock file or half a ref behind,
    and a cleanup cut short leaves what it was removing; both finish first,
    and the signal is then delivered (and unwinds) as usual. Children inherit
    the mask, so a git started here also runs to its end.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text or "a process that has not written its name yet"


def _try_lock(path: Path) -> int | None:
    """An fd holding the lock on path, or None while another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    # The holder before us may have removed the file after we opened it: then
    # our lock is on a file nobody else will find, so take the new one.
    try:
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return _try_lock(path)
    return fd


@contextmanager
def held(path: Path, target: str, wait_s: float) -> Iterator[None]:
    """Hold the lock at path for target, waiting up to wait_s for another holder."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        with deferred_signals():
            fd = _try_lock(path)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise BackportError(
                Exit.LOCKED,
                f"another run is working on {target}: {_holder(path)} (lock {path})",
                "wait for it to finish and run again, or pass --wait SECONDS to wait "
                "longer; the lock goes away by itself when that process ends",
            )
        if not told:
            print(f"waiting for {_holder(path)} to finish with {target}", file=sys.stderr)
            told = True
        time.sleep(0.2)
    _held.append(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} ({' '.join(sys.argv)})\n".encode())
        yield
    finally:
        with deferred_signals():
            _held.remove(fd)
            with suppress(FileNotFoundError):
                path.unlink()
            os.close(fd)
