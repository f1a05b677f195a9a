"""patches/releases.toml: the one place for what every release shares, and who reads it.

Recognition (the manifest's known releases), check-install (which races a
release leaves open), lint (a base's blob ids agree with its entry) and the
manifest's own checks all read the registry; no pin.toml repeats it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from patchset import paths, recognise
from patchset.errors import BackportError, Exit
from patchset.manifest import (
    BASE_STEP,
    RELEASES_NAME,
    PinManifest,
    Releases,
    Series,
    load_releases,
    patch_set_folders,
)

DECODE = "python/sglang/srt/disaggregation/decode.py"
# What only the registry may hold; a pin.toml that repeats it is a copy that can drift.
SHARED_TABLES = ("known-releases", "upstream-fixed")


def test_every_release_from_0_5_13_to_0_5_23_is_known_once() -> None:
    registry = load_releases()
    releases = list(registry.known)
    assert (releases[0], releases[-1]) == ("0.5.13", "0.5.23")
    assert len(registry.known) == 13
    assert registry.upstream_fixed.version == "0.5.19"
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        data = tomllib.loads((folder / "pin.toml").read_text(encoding="utf-8"))
        assert not set(SHARED_TABLES) & set(data), folder.name
        assert BASE_STEP not in data["step-fixes"], folder.name
        manifest = Series.load(folder).manifest
        for release in manifest.releases:
            assert registry.known[release].blobs == manifest.blobs_at(BASE_STEP), release
            assert manifest.step_fixes[BASE_STEP] == registry.known[release].fixes


def test_recognition_names_releases_from_the_registry(tmp_path: Path) -> None:
    manifest = Series.load(paths.DEFAULT_PATCH_DIR).manifest
    later = load_releases().known["0.5.20"].blobs
    assert recognise.nearest_release(manifest, dict(later)) == "0.5.20"
    # without 0.5.20 in the registry, the same files are not named 0.5.20
    text = (paths.PATCHES_ROOT / RELEASES_NAME).read_text(encoding="utf-8")
    start = text.index('[releases."0.5.20"]\n')
    end = text.index('[releases."0.5.21"]\n')
    (tmp_path / RELEASES_NAME).write_text(text[:start] + text[end:], encoding="utf-8")
    fewer = Releases.load(tmp_path / RELEASES_NAME)
    other = PinManifest.load(paths.DEFAULT_PATCH_DIR / "pin.toml", fewer)
    assert "0.5.20" not in other.known_releases
    assert recognise.nearest_release(other, dict(later)) != "0.5.20"


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("[step-fixes]\n", '[step-fixes]\nbase = ["fix-a"]\n', r"step-fixes\.base is given here"),
        ("[step-fixes]\n", '[step-fixes]\n"2" = []\n', r"step-fixes\.2 is not a step"),
        ('"0002" = ["fix-b"]\n', '"0002" = ["fix-z"]\n', r"step-fixes\.0002 names fix-z"),
        ('"0002" = ["fix-b"]\n', "", r"step-fixes\.0002 is missing"),
    ],
)
def test_step_fixes_are_checked_against_the_registry(
    patch_set: Path, old: str, new: str, problem: str
) -> None:
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    assert old in text
    pin.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(BackportError, match=problem) as raised:
        PinManifest.load(pin)
    assert raised.value.code == Exit.PATCHSET_INVALID
    assert str(pin) in raised.value.problem


def scratch_project(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of scripts/ and patches/ whose releases.toml has old replaced by new."""
    root = tmp_path / "project"
    for part in ("scripts", "patches"):
        shutil.copytree(
            paths.PROJECT_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__")
        )
    registry = root / "patches" / RELEASES_NAME
    text = registry.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    registry.write_text(text.replace(old, new), encoding="utf-8")
    return root


def command(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SGLANG_BACKPORTS_BUILD=str(root / "build"))
    script, *rest = args
    return subprocess.run(
        [sys.executable, str(root / "scripts" / script), *rest],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )


def test_lint_finds_a_base_whose_blobs_disagree_with_the_registry(tmp_path: Path) -> None:
    registry = load_releases()
    ours = registry.known["0.5.15.post1"].blobs[DECODE]
    theirs = registry.known["0.5.15"].blobs[DECODE]
    block = '[releases."0.5.15.post1"]'
    text = (paths.PATCHES_ROOT / RELEASES_NAME).read_text(encoding="utf-8")
    entry = text[text.index(block) : text.index('[releases."0.5.16"]')]
    root = scratch_project(tmp_path, entry, entry.replace(ours, theirs))
    result = command(root, "lint-patches")
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert "[manifest] [blobs] base holds" in result.stdout
    assert f'{root / "patches" / RELEASES_NAME} [releases."0.5.15.post1"] blobs' in result.stdout
    # the other bases are not concerned
    assert command(root, "lint-patches", "--patch-set", "patches/sglang-0.5.16").returncode == 0


def test_check_install_refuses_a_release_whose_races_are_not_measured(tmp_path: Path) -> None:
    """A release whose fixes no step of any series holds: which races are open is unknown."""
    root = scratch_project(
        tmp_path,
        '[releases."0.5.20"]\nfixes = ["fix-b"]',
        '[releases."0.5.20"]\nfixes = ["fix-a", "fix-b"]',
    )
    result = command(root, "check-install", "--tree", str(tmp_path))
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert "sglang 0.5.20 carries fix-a, fix-b, and no step of a series" in result.stderr
    assert "Traceback" not in result.stderr
