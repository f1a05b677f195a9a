"""Where things live: the project, its patch sets, its build folder and the wheel cache."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PATCHES_ROOT = PROJECT_ROOT / "patches"
DEFAULT_BASE = "0.5.15.post1"
DEFAULT_PATCH_DIR = PATCHES_ROOT / f"sglang-{DEFAULT_BASE}"


def build_dir() -> Path:
    """The project's build folder; SGLANG_BACKPORTS_BUILD moves it (tests do)."""
    return Path(os.environ.get("SGLANG_BACKPORTS_BUILD", PROJECT_ROOT / "build"))


def cache_dir() -> Path:
    """Downloaded wheels, kept across clones; SGLANG_BACKPORTS_CACHE moves it."""
    override = os.environ.get("SGLANG_BACKPORTS_CACHE")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "sglang-backports"
