"""The pinned sglang wheels: download with pip, check the sha256, cache, unpack;
and the marked temporary folders that a download and build-wheel write in."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import BackportError, Exit
from .lock import DEFAULT_WAIT_S, deferred_signals, held
from .manifest import WheelPin, sha256_of
from .textout import progress

PACKAGE_PREFIX = "sglang/"
# The wheel holds the repository's python/sglang/ tree as sglang/.
REPO_PREFIX = "python/"
# A download's temporary folder in the cache.
DOWNLOAD_PREFIX = ".download-"

# What a download and build-wheel leave only when they are killed: a folder
# named PREFIX<16 hex digits>SUFFIX holding TEMP_MARKER, whose content is
# TEMP_MARKER_TEXT. The run that made it holds an flock on the marker while it
# works (and so does the pip it starts there), so the next run tells a leftover
# (marked, its maker gone) from a folder a live run is using (locked) and from
# anything else, and removes only the leftovers. Making a folder and sweeping
# leftovers both hold TEMP_LOCK in the parent folder, so a sweep also knows
# that a folder of ours caught half-made (empty, or its marker not yet named)
# was left by a killed run, not one that is making it now.
TEMP_MARKER = ".made-by-sglang-backports"
TEMP_MARKER_TEXT = (
    b"a temporary folder of sglang-backports (scripts/build-wheel, or a download into "
    b"the wheel cache); the next run removes it once the run that made it has ended\n"
)
TEMP_LOCK = ".sglang-backports-temp.lock"
_UNNAMED = f"{TEMP_MARKER}.new"


def _temp_names(prefix: str, suffix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + "[0-9a-f]{16}" + re.escape(suffix))


@contextmanager
def _temp_lock(parent: Path) -> Iterator[None]:
    with held(parent / TEMP_LOCK, f"the temporary folders in {parent}", DEFAULT_WAIT_S):
        yield


@contextmanager
def marked_folder(parent: Path, prefix: str, suffix: str = "") -> Iterator[tuple[Path, int]]:
    """A temporary folder in parent, marked and locked, removed when the block ends;
    first the leftovers of killed runs there are removed.

    Yields the folder and the fd that holds its lock: a child process that
    works in the folder should inherit it (pass_fds), so that it holds the lock
    until it ends even if this process is killed.
    """
    made: list[tuple[Path, int]] = []
    try:
        with _temp_lock(parent):
            _sweep(parent, prefix, suffix)
            with deferred_signals():
                made.append(_make_marked(parent, prefix, suffix))
        # a signal held while the folder was made lands inside this try: it is removed
        yield made[0]
    finally:
        with deferred_signals():
            for folder, fd in made:
                _remove_marked(folder)
                os.close(fd)


def _make_marked(parent: Path, prefix: str, suffix: str) -> tuple[Path, int]:
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            folder.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    fd = -1
    try:
        # Locked before it has its name, so a named marker is locked while its maker lives.
        fd = os.open(folder / _UNNAMED, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with suppress(OSError):  # no flock on this file system: no sweep can take it either
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, TEMP_MARKER_TEXT)
        (folder / _UNNAMED).rename(folder / TEMP_MARKER)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, fd


def _remove_marked(folder: Path) -> None:
    """Remove a folder of ours: its marker last, so a removal cut short stays marked."""
    with suppress(FileNotFoundError):
        for entry in folder.iterdir():
            if entry.name == TEMP_MARKER:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
        (folder / TEMP_MARKER).unlink(missing_ok=True)
        folder.rmdir()


def _is_leftover(folder: Path) -> bool:
    """Whether folder (named as ours) is a killed run's; call with the parent's TEMP_LOCK held."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if not names:
        return True  # killed between making the folder and its marker
    unnamed = names == [_UNNAMED]  # killed before the marker got its name
    if not unnamed and TEMP_MARKER not in names:
        return False
    try:
        fd = os.open(
            folder / names[0] if unnamed else folder / TEMP_MARKER,
            os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        text = os.read(fd, len(TEMP_MARKER_TEXT) + 1)
        if not (TEMP_MARKER_TEXT.startswith(text) if unnamed else text == TEMP_MARKER_TEXT):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its maker lives
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _sweep(parent: Path, prefix: str, suffix: str) -> list[Path]:
    """Remove the leftovers of killed runs in parent; call with its TEMP_LOCK held."""
    names = _temp_names(prefix, suffix)
    removed = []
    for folder in sorted(parent.iterdir()):
        if not names.fullmatch(folder.name) or folder.is_symlink() or not folder.is_dir():
            continue
        if _is_leftover(folder):
            with deferred_signals():
                _remove_marked(folder)
            progress(f"removed {folder}, which a killed run left")
            removed.append(folder)
    return removed


def remove_leftovers(parent: Path, prefix: str, suffix: str = "") -> list[Path]:
    """Remove what killed runs left in parent (see marked_folder); returns what went."""
    names = _temp_names(prefix, suffix)
    if not any(names.fullmatch(name) for name in os.listdir(parent)):
        return []
    with _temp_lock(parent):
        return _sweep(parent, prefix, suffix)


def _check_hash(path: Path, pin: WheelPin, where: str) -> None:
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise BackportError(
            Exit.WHEEL_HASH,
            f"the {where} wheel {path} has sha256 {actual}, but the manifest pins "
            f"{pin.sha256} for {pin.wheel}",
            f"delete {path} and run again; if a fresh download still differs, "
            "the file on the package index is not the one this series was made "
            "against: do not use it",
        )


def _pip_download(pin: WheelPin, dest: Path, lock_fd: int) -> subprocess.CompletedProcess[str]:
    name, _version, python_tag, abi, platform = pin.wheel[: -len(".whl")].split("-")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        "--only-binary=:all:", "--disable-pip-version-check",
        "--implementation", python_tag[:2], "--python-version", python_tag[2:],
        "--abi", abi, "--platform", platform,
        "--dest", str(dest), f"{name}=={pin.version}",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, pass_fds=(lock_fd,))


def _download(pin: WheelPin, tmp: Path, lock_fd: int, cache: Path) -> Path:
    """pin's wheel, downloaded with pip into the marked folder tmp."""
    result = _pip_download(pin, tmp, lock_fd)
    downloaded = tmp / pin.wheel
    if "No module named pip" in result.stderr:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"{sys.executable} has no pip, which downloads {pin.wheel}",
            f"install pip (`{sys.executable} -m ensurepip`), or put the wheel "
            f"into {cache} by hand, and run again",
        )
    if result.returncode != 0 or not downloaded.is_file():
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackportError(
            Exit.WHEEL_UNAVAILABLE,
            f"could not download {pin.wheel} (sglang=={pin.version}) with pip, "
            f"and it is not in the cache {cache}. pip said: {detail}",
            "connect to the package index (or set pip's index options), or "
            f"put the wheel into {cache} by hand",
        )
    return downloaded


def fetch_wheel(pin: WheelPin, cache: Path) -> Path:
    """The pinned wheel from the cache, downloading it once if it is not there."""
    cached = cache / pin.wheel
    if cache.is_dir():
        with suppress(OSError):  # a read-only cache still serves its wheel
            remove_leftovers(cache, DOWNLOAD_PREFIX)
    if cached.is_file():
        _check_hash(cached, pin, "cached")
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {pin.wheel} with pip into {cache}")
    with marked_folder(cache, DOWNLOAD_PREFIX) as (tmp, lock_fd):
        downloaded = _download(pin, tmp, lock_fd, cache)
        _check_hash(downloaded, pin, "downloaded")
        # pip copies a wheel it takes from a local folder (--find-links) with that
        # file's mode; the cache gets the mode any new file of this user gets.
        with deferred_signals():
            umask = os.umask(0o077)
            os.umask(umask)
        downloaded.chmod(0o666 & ~umask)
        downloaded.replace(cached)
    return cached


@contextmanager
def unpinned_wheel(pin: WheelPin, cache: Path) -> Iterator[Path]:
    """A wheel no manifest pins yet (pin.sha256 is not checked: the caller records
    the file's), downloaded into a marked folder of the cache for as long as the
    block runs; the cache itself keeps pinned wheels only."""
    cache.mkdir(parents=True, exist_ok=True)
    with marked_folder(cache, DOWNLOAD_PREFIX) as (tmp, lock_fd):
        yield _download(pin, tmp, lock_fd, cache)


def read_files(wheel: Path, repo_paths: list[str]) -> dict[str, bytes]:
    """The given python/sglang/... files as the wheel holds them."""
    with zipfile.ZipFile(wheel) as archive:
        return {path: archive.read(path.removeprefix(REPO_PREFIX)) for path in repo_paths}


def extract_package(wheel: Path, dest: Path) -> Path:
    """Lay the wheel's sglang/ tree out as dest/python/sglang/; returns dest/python.

    ZipFile.extractall keeps every member inside the target (it drops `..` and
    absolute parts of a name), so a hostile wheel cannot write elsewhere.
    """
    target = dest / REPO_PREFIX
    with zipfile.ZipFile(wheel) as archive:
        members = [
            m
            for m in archive.infolist()
            if m.filename.startswith(PACKAGE_PREFIX) and not m.is_dir()
        ]
        archive.extractall(target, members=members)
    return target
