"""The pinned sglang wheels: download with pip, check the sha256, cache, unpack."""

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .catalog import REPO_PREFIX  # the wheel holds the repository's python/sglang/ as sglang/
from .errors import BackportError, Exit
from .lock import held_fds, marked_folder, remove_leftovers
from .manifest import WheelPin, sha256_of
from .textout import progress

DOWNLOAD_PREFIX = ".download-"  # a download's marked folder in the cache


def _check_hash(path: Path, pin: WheelPin, where: str) -> None:
    if (actual := sha256_of(path)) != pin.sha256:
        raise BackportError(
            Exit.WHEEL_HASH,
            f"the {where} wheel {path} has sha256 {actual}, but the manifest pins "
            f"{pin.sha256} for {pin.wheel}",
            f"delete {path} and run again; if a fresh download still differs, the file on the "
            "package index is not the one this series was made against: do not use it",
        )


def fetch_wheel(pin: WheelPin, cache: Path) -> Path:
    cached = cache / pin.wheel
    with suppress(OSError):  # a read-only cache still serves its wheel
        remove_leftovers(cache, DOWNLOAD_PREFIX)
    if cached.is_file():
        _check_hash(cached, pin, "cached")
        return cached
    progress(f"downloading {pin.wheel} with pip into {cache}")
    with unpinned_wheel(pin, cache) as downloaded:
        _check_hash(downloaded, pin, "downloaded")
        # pip keeps a --find-links wheel's mode; a fresh copy gets this user's usual mode
        shutil.copyfile(downloaded, downloaded.with_name("copy"))
        downloaded.with_name("copy").replace(cached)
    return cached


@contextmanager
def unpinned_wheel(pin: WheelPin, cache: Path) -> Iterator[Path]:
    """A wheel downloaded into a marked folder: the cache keeps pinned, checked wheels only."""
    cache.mkdir(parents=True, exist_ok=True)
    python_tag, abi, platform = pin.tags
    with marked_folder(cache, DOWNLOAD_PREFIX) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps",
            "--only-binary=:all:", "--disable-pip-version-check",
            "--implementation", python_tag[:2], "--python-version", python_tag[2:],
            "--abi", abi, "--platform", platform,
            "--dest", str(tmp), f"{pin.wheel.split('-', 1)[0]}=={pin.version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, pass_fds=held_fds())
        if "No module named pip" in result.stderr:
            raise BackportError(
                Exit.ENVIRONMENT,
                f"{sys.executable} has no pip, which downloads {pin.wheel}",
                f"install pip (`{sys.executable} -m ensurepip`), or put the wheel "
                f"into {cache} by hand, and run again",
            )
        if result.returncode != 0 or not (tmp / pin.wheel).is_file():
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BackportError(
                Exit.WHEEL_UNAVAILABLE,
                f"could not download {pin.wheel} (sglang=={pin.version}) with pip, "
                f"and it is not in the cache {cache}. pip said: {detail}",
                "connect to the package index (or set pip's index options), or "
                f"put the wheel into {cache} by hand",
            )
        yield tmp / pin.wheel


def read_files(wheel: Path, repo_paths: list[str]) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {path: archive.read(path.removeprefix(REPO_PREFIX)) for path in repo_paths}


def extract_package(wheel: Path, dest: Path) -> Path:
    """The wheel's sglang/ as dest/python/sglang/ (extractall drops `..`: nowhere else)."""
    target = dest / REPO_PREFIX
    with zipfile.ZipFile(wheel) as archive:
        ours = [m for m in archive.infolist() if m.filename.startswith("sglang/")]
        archive.extractall(target, members=[m for m in ours if not m.is_dir()])
    return target
