"""scripts/check-install: what an environment's sglang runs, in a real scratch venv and on trees."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import SCRIPTS, make_venv, pip
from patchset import deploy, paths, wheel
from patchset.apply import git_apply, scratch_copy
from patchset.errors import Exit
from patchset.manifest import Series, patch_set_folders, release_key

BASE = "0.5.15.post1"
OURS = f"{BASE}+pdrace.2"
# The race checker's scenarios an unpatched 0.5.15.post1 leaves open, and those
# fix A (#30435) leaves open: all but S2, the consumer race.
OPEN_AT_BASE = "S1, S2, S3, S4, S5, S6, S7, S8, S9, L1, L2, L3, L4"
OPEN_WITH_FIX_A = "S1, S3, S4, S5, S6, S7, S8, S9, L1, L2, L3, L4"
DECODE = "srt/disaggregation/decode.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "check-install"), *args], capture_output=True, text=True
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"^verdict: (.*)$", result.stdout, re.M)
    assert found, result.stdout + result.stderr
    return found[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "venv")


def site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def test_install_upgrade_edit_uninstall_reinstall(
    venv: Path, ours: Path, series: Series, wheel_cache: Path
):
    original = wheel_cache / series.manifest.base.wheel
    site = site_packages(venv)

    pip(venv, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", str(original))
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert verdict(result) == f"affected: unpatched sglang {BASE}; races open: {OPEN_AT_BASE}"
    assert result.stdout.count("matches RECORD") == 3

    pip(
        venv,
        "install",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--force-reinstall",
        "--quiet",
        str(ours),
    )
    result = check("--python", str(venv))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"patched: sglang {BASE} with the series sglang-{BASE}")
    assert result.stdout.count("matches RECORD") == 3
    version = subprocess.run(
        [str(venv), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == OURS
    assert sorted(p.name for p in site.glob("sglang*")) == ["sglang", f"sglang-{OURS}.dist-info"]

    # an in-place edit pip does not know of
    decode = site / "sglang" / DECODE
    text = decode.read_bytes()
    decode.write_bytes(text + b"# hot fix\n")
    result = check("--python", str(venv))
    assert result.returncode == Exit.MODIFIED, result.stdout
    assert f"python/sglang/{DECODE}" in result.stdout and "differs from RECORD" in result.stdout
    decode.write_bytes(text)
    assert check("--python", str(venv)).returncode == Exit.OK

    pip(venv, "uninstall", "--yes", "--quiet", "sglang")
    assert list(site.glob("sglang*")) == []
    result = check("--python", str(venv))
    assert result.returncode == Exit.NOT_INSTALLED
    assert "finds no sglang package" in result.stderr

    pip(venv, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", str(original))
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout


def step_tree(root: Path, series: Series, wheel_cache: Path, step: str) -> Path:
    """A folder holding sglang/ with the three files at a step of the series."""
    manifest = series.manifest
    files = wheel.read_files(wheel_cache / manifest.base.wheel, manifest.files)
    upto = manifest.steps.index(step)
    with scratch_copy(dict(files)) as scratch:
        for patch in series.patch_paths[:upto]:
            assert git_apply(scratch, patch).returncode == 0
        for path in manifest.files:
            out = root / path.removeprefix("python/")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes((scratch / path).read_bytes())
    return root


def test_fix_a_only_is_a_partial_fix(tmp_path: Path, series: Series, wheel_cache: Path):
    tree = step_tree(tmp_path, series, wheel_cache, "0001")
    result = check("--tree", str(tree))
    assert result.returncode == Exit.PARTIAL_FIX, result.stdout
    assert verdict(result) == (
        f"partial fix: sglang {BASE} with sglang-{BASE} applied up to patch 0001 "
        f"(has sgl-project/sglang#30435 only); races still open: {OPEN_WITH_FIX_A}"
    )


def test_fixed_upstream(tmp_path: Path, upstream_fixed_wheel: Path):
    with zipfile.ZipFile(upstream_fixed_wheel) as archive:
        for member in archive.namelist():
            if member.startswith("sglang/srt/") and member.endswith(".py"):
                archive.extract(member, tmp_path)
    result = check("--tree", str(tmp_path))
    assert result.returncode == Exit.OK, result.stdout
    assert verdict(result) == "fixed upstream: sglang 0.5.19; races closed"


def test_unknown_content_and_no_sglang(tmp_path: Path, series: Series, wheel_cache: Path):
    tree = step_tree(tmp_path / "t", series, wheel_cache, series.manifest.final_step)
    assert check("--tree", str(tree)).returncode == Exit.OK
    (tree / "sglang" / DECODE).write_text("# not sglang\n")
    result = check("--tree", str(tree))
    assert result.returncode == Exit.UNKNOWN_CONTENT, result.stdout
    assert "unknown content" in verdict(result)
    empty = check("--tree", str(tmp_path / "nothing-here"))
    assert empty.returncode == Exit.NOT_INSTALLED
    assert "holds no sglang package" in empty.stderr


def test_a_python_that_cannot_be_asked(tmp_path: Path):
    missing = check("--python", str(tmp_path / "no-python"))
    assert missing.returncode == Exit.ENVIRONMENT
    assert "no such file" in missing.stderr
    not_python = tmp_path / "fake"
    not_python.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    not_python.chmod(0o755)
    result = check("--python", str(not_python))
    assert result.returncode == Exit.ENVIRONMENT
    assert "not a python this command can ask (exit status 3; it said: nope)" in result.stderr


def test_every_known_release_is_named_with_the_races_it_leaves_open():
    catalog = deploy.load_catalog(paths.PATCHES_ROOT)
    series = Series.load(paths.DEFAULT_PATCH_DIR)
    assert len(series.manifest.known_releases) == 13
    for release, blobs in series.manifest.known_releases.items():
        matches = catalog.lookup(blobs)
        assert matches, release
        open_ = ", ".join(matches[0].open)
        if release_key(release) >= release_key("0.5.19"):
            assert open_ == "", release
        elif release_key(release) >= release_key("0.5.16"):
            assert open_ == OPEN_WITH_FIX_A, release
        else:
            assert "S1, S2, S3" in open_, release


def test_open_races_per_step_agree_with_the_race_checker_table():
    """On every base and step, check-install's open races are the race table's open cells."""
    from racecheck import report
    from racecheck.catalogue import SCENARIOS

    catalog = deploy.load_catalog(paths.PATCHES_ROOT)
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        manifest = Series.load(folder).manifest
        expected = report.expected_table(manifest, SCENARIOS)
        for step in manifest.steps:
            measured = tuple(s for s in SCENARIOS if expected[s][step])
            assert catalog.lookup(manifest.blobs_at(step))[0].open == measured, (folder, step)


def test_the_pip_installed_tree_is_patched(installed_tree: Path):
    """What pip installs from our wheel is the patched release (its race-check:
    test_racecheck_command)."""
    result = check("--tree", str(installed_tree))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"patched: sglang {BASE} with the series sglang-{BASE}")
