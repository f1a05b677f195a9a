"""patches/releases.toml: the one place for what every release shares, and who reads it.

Recognition (the manifest's known releases), check-install (which races a
release leaves open, its launch profile), lint (the series' blob ids follow
from the release's), race-check --writers (the rows every release shares) and
the manifest's own checks all read the registry; no pin.toml repeats it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from patchset import paths
from patchset.catalog import load_catalog
from patchset.errors import BackportError, Exit
from patchset.manifest import (
    BASE_STEP,
    RELEASES_NAME,
    PinManifest,
    Series,
    load_releases,
    patch_set_folders,
)

DECODE = "python/sglang/srt/disaggregation/decode.py"
OVERLAP = "python/sglang/srt/managers/overlap_utils.py"
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
        # the base's blob ids are the registry's alone
        assert all(BASE_STEP not in by_step for by_step in data["blobs"].values()), folder.name
        # no pin.toml repeats a writer row every release shares
        assert not set(data["writers"]) & set(registry.writers), folder.name
        manifest = Series.load(folder).manifest
        for release in manifest.releases:
            assert registry.known[release].blobs == manifest.blobs_at(BASE_STEP), release
            assert manifest.step_fixes[BASE_STEP] == registry.known[release].fixes
            # every release served has launch settings, from a profile it names
            assert registry.launch[release].release == release


def test_launch_profiles_are_said_once() -> None:
    """Two shapes of [launch] settings, each one table that its releases name."""
    launch = load_releases().launch
    profiles = {settings.profile: settings for settings in launch.values()}
    assert sorted(profiles) == ["read-done-barrier", "whole-stream-barrier"]
    assert [v for v, s in launch.items() if s.profile == "whole-stream-barrier"] == [
        "0.5.13",
        "0.5.13.post1",
    ]
    old, new = profiles["whole-stream-barrier"], profiles["read-done-barrier"]
    assert (old.war_barrier_env, old.war_fast_path) == (False, False)
    assert (new.war_barrier_env, new.war_fast_path) == (True, True)
    assert "disable_decode_cuda_graph" in new.flags and "disable_decode_cuda_graph" not in old.flags


def test_recognition_names_releases_from_the_registry(tmp_path: Path) -> None:
    later = load_releases().known["0.5.20"].blobs
    assert load_catalog(paths.PATCHES_ROOT).nearest_release(dict(later)) == "0.5.20"
    # without 0.5.20 in the registry, the same files are not named 0.5.20
    root = tmp_path / "patches"
    shutil.copytree(paths.PATCHES_ROOT, root)
    text = (root / RELEASES_NAME).read_text(encoding="utf-8")
    start = text.index('[releases."0.5.20"]\n')
    end = text.index('[releases."0.5.21"]\n')
    (root / RELEASES_NAME).write_text(text[:start] + text[end:], encoding="utf-8")
    fewer = load_catalog(root)
    assert "0.5.20" not in fewer.releases
    assert fewer.nearest_release(dict(later)) != "0.5.20"


PIN_BLOBS = '"python/sglang/srt/disaggregation/decode.py" = { "0001" = '


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("[step-fixes]\n", '[step-fixes]\nbase = ["fix-a"]\n', r"step-fixes\.base is given here"),
        ("[step-fixes]\n", '[step-fixes]\n"2" = []\n', r"step-fixes\.2 is not a step"),
        ('"0002" = ["fix-b"]\n', '"0002" = ["fix-z"]\n', r"step-fixes\.0002 names fix-z"),
        ('"0002" = ["fix-b"]\n', "", r"step-fixes\.0002 is missing"),
        # the base's blob ids are releases.toml's: a copy here is refused, not compared
        (PIN_BLOBS, PIN_BLOBS.replace("{ ", f'{{ "base" = "{"0" * 40}", '), r"\.base is given"),
        ("[blobs]\n", '[blobs]\n"python/x.py" = { "0001" = "' + "0" * 40 + '" }\n', "not a file"),
    ],
)
def test_step_fixes_and_blobs_are_checked_against_the_registry(
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


def test_a_same_files_release_whose_blobs_differ_is_refused(tmp_path: Path) -> None:
    """0.5.13's series serves 0.5.13.post1 only while their files are the same."""
    registry = load_releases()
    block = '[releases."0.5.13.post1"]'
    text = (paths.PATCHES_ROOT / RELEASES_NAME).read_text(encoding="utf-8")
    entry = text[text.index(block) : text.index('[releases."0.5.14"]')]
    ours = registry.known["0.5.13.post1"].blobs[DECODE]
    root = scratch_project(
        tmp_path, entry, entry.replace(ours, registry.known["0.5.14"].blobs[DECODE])
    )
    fewer = load_releases(root / "patches" / RELEASES_NAME)
    with pytest.raises(BackportError, match=r'same-files\."0\.5\.13\.post1" is served') as raised:
        PinManifest.load(paths.PATCHES_ROOT / "sglang-0.5.13" / "pin.toml", fewer)
    assert raised.value.code == Exit.PATCHSET_INVALID


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


@pytest.mark.parametrize(
    ("path", "said"),
    [
        # 0001 does not touch decode.py: its blob at 0001 must be the release's
        (DECODE, f"does not touch {DECODE}, but [blobs] pins "),
        # 0001 patches overlap_utils.py: its pre-image must be the release's
        (OVERLAP, f"{OVERLAP}: pre-image blob "),
    ],
)
def test_lint_finds_a_registry_entry_the_series_contradicts(
    tmp_path: Path, path: str, said: str
) -> None:
    registry = load_releases()
    ours = registry.known["0.5.15.post1"].blobs[path]
    theirs = registry.known["0.5.15"].blobs[path]
    block = '[releases."0.5.15.post1"]'
    text = (paths.PATCHES_ROOT / RELEASES_NAME).read_text(encoding="utf-8")
    entry = text[text.index(block) : text.index('[releases."0.5.16"]')]
    root = scratch_project(tmp_path, entry, entry.replace(ours, theirs))
    result = command(root, "lint-patches")
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert said in result.stdout
    assert f'releases.toml [releases."0.5.15.post1"] has {theirs} at step base' in result.stdout
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
