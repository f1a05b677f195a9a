"""Where things live: the project, its patch sets, its build folder and the wheel cache."""

import os
from pathlib import Path

from .errors import BackportError, Exit

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PATCHES_ROOT = PROJECT_ROOT / "patches"
DEFAULT_BASE = "0.5.15.post1"
DEFAULT_PATCH_DIR = PATCHES_ROOT / f"sglang-{DEFAULT_BASE}"


def build_dir() -> Path:
    """The project's build folder; SGLANG_BACKPORTS_BUILD moves it (tests do)."""
    return Path(os.environ.get("SGLANG_BACKPORTS_BUILD", PROJECT_ROOT / "build"))


def cache_dir() -> Path:
    """Downloaded wheels, kept across clones; SGLANG_BACKPORTS_CACHE moves it."""
    if override := os.environ.get("SGLANG_BACKPORTS_CACHE"):
        return Path(override)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "sglang-backports"
    if not os.environ.get("HOME"):
        raise BackportError(
            Exit.ENVIRONMENT,
            "HOME is not set, so there is no cache folder for the sglang wheel",
            "set HOME, or SGLANG_BACKPORTS_CACHE to a writable folder, and run again",
        )
    return Path(os.environ["HOME"]) / ".cache" / "sglang-backports"
