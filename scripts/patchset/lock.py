"""One run at a time per target (a named flock), no half-made state on a kill, marked_folder."""

import errno
import fcntl
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path

# re-exported: apply, run-tests and the tests take them from here
from .cli import INTERRUPTS, hold_interrupts, release_interrupts  # noqa: F401
from .errors import BackportError, Exit
from .textout import progress

DEFAULT_WAIT_S = 30.0  # how long a second run waits for the first (--wait)
TELL_AFTER_S = 1.0  # a wait shorter than this is not worth a line on stderr
# Every git or pip we start inherits these fds: one that outlives a killed run holds them.
_held: list[int] = []


def held_fds() -> tuple[int, ...]:
    return tuple(_held)


def tmpdir() -> Path:
    return Path(tempfile.gettempdir())


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold the interrupts for the block (children too): a git cut short leaves a lock file."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _holder(path: Path) -> str:
    with suppress(OSError):
        if named := path.read_text(encoding="utf-8", errors="replace").strip():
            return named
    return "a process that has not written its name yet"


def _try_lock(path: Path) -> int | None:
    """An fd holding the lock on path, or None while another process holds it."""
    with deferred_signals():  # an fd opened is closed or returned
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        # The holder before us may have removed the file after we opened it: take the new one.
        with suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        os.close(fd)
    return _try_lock(path)


@contextmanager
def held(path: Path, target: str, wait_s: float) -> Iterator[None]:
    started = time.monotonic()
    told = False
    while (fd := _try_lock(path)) is None:
        if time.monotonic() >= started + wait_s:
            raise BackportError(
                Exit.LOCKED,
                f"another run is working on {target}: {_holder(path)} (lock {path})",
                "wait for it to finish and run again, or pass --wait SECONDS to wait "
                "longer; the lock goes away by itself when that process ends",
            )
        if not told and time.monotonic() >= started + TELL_AFTER_S:
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
            path.unlink(missing_ok=True)
            os.close(fd)


# PREFIX<16 hex>SUFFIX holding TEMP_MARKER, flocked by its maker and children (held_fds): a
# sweep removes a killed run's (marked, unlocked) only. Making and sweeping hold this user's
# lock in parent, so one caught half-made is a killed run's; other users' are never judged.
TEMP_MARKER = ".made-by-sglang-backports"
TEMP_MARKER_TEXT = (
    b"a temporary folder of sglang-backports; the next run removes it once the run "
    b"that made it has ended\n"
)


def _temp_lock(parent: Path) -> AbstractContextManager[None]:
    path = parent / f".sglang-backports-temp-{os.getuid()}.lock"
    return held(path, f"the temporary folders in {parent}", DEFAULT_WAIT_S)


@contextmanager
def marked_folder(parent: Path, prefix: str, suffix: str = "") -> Iterator[Path]:
    """A marked, locked temporary folder in parent for the block; killed runs' go first."""
    remove_leftovers(parent, prefix, suffix)
    with ExitStack() as stack:
        with _temp_lock(parent), deferred_signals():
            folder, fd = _make_marked(parent, prefix, suffix)
            _held.append(fd)
            # registered before a signal held meanwhile lands: the folder is removed
            stack.callback(_remove_marked, folder, fd)
        yield folder


def _make_marked(parent: Path, prefix: str, suffix: str) -> tuple[Path, int]:
    # the name the sweep matches (not mkdtemp's): folders of earlier releases are still found;
    # 64 random bits, so a clash is as unlikely as any other failure of mkdir
    folder = parent / f"{prefix}{secrets.token_hex(8)}{suffix}"
    folder.mkdir(mode=0o700)
    with ExitStack() as undo:  # on any failure: nothing of it left
        undo.callback(shutil.rmtree, folder, ignore_errors=True)
        fd = os.open(folder / TEMP_MARKER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        undo.callback(os.close, fd)
        with suppress(OSError):  # no flock on this file system: no sweep can take it either
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, TEMP_MARKER_TEXT)
        undo.pop_all()
    return folder, fd


def _remove_marked(folder: Path, fd: int | None = None) -> None:
    """Remove a folder of ours, its marker last (one cut short stays marked); then our fd's."""
    with deferred_signals():
        with suppress(FileNotFoundError):
            for entry in folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                elif entry.name != TEMP_MARKER:
                    entry.unlink(missing_ok=True)
            (folder / TEMP_MARKER).unlink(missing_ok=True)
            folder.rmdir()
        if fd is not None:
            _held.remove(fd)
            os.close(fd)


def _is_leftover(folder: Path) -> bool:
    """Whether folder (named as ours) is a killed run's; call with the parent's lock held."""
    with suppress(OSError), ExitStack() as stack:
        if os.lstat(folder).st_uid != os.getuid():
            return False
        if not (names := os.listdir(folder)):
            return True  # killed before its marker was made
        fd = os.open(folder / TEMP_MARKER, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        stack.callback(os.close, fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a fifo's read would never return
            return False
        text = os.read(fd, len(TEMP_MARKER_TEXT) + 1)
        # alone, the marker may be half-written: its maker was killed while writing it
        half = names == [TEMP_MARKER] and TEMP_MARKER_TEXT.startswith(text)
        if half or text == TEMP_MARKER_TEXT:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its maker lives
            return True
    return False


def remove_leftovers(parent: Path, prefix: str, suffix: str = "") -> list[Path]:
    names = re.compile(re.escape(prefix) + "[0-9a-f]{16}" + re.escape(suffix))
    if not parent.is_dir() or not any(names.fullmatch(name) for name in os.listdir(parent)):
        return []
    removed = []
    with _temp_lock(parent):
        for folder in sorted(parent.iterdir()):
            if names.fullmatch(folder.name) and not folder.is_symlink() and _is_leftover(folder):
                _remove_marked(folder)
                progress(f"removed {folder}, which a killed run left")
                removed.append(folder)
    return removed
