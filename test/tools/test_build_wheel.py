"""scripts/build-wheel: a reproducible patched wheel, different only where it must be."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import SCRIPTS, TEST_PINS, WHEEL_BUILDS, make_venv, pip
from patched_wheel import assert_only_patched_differ, assert_record_right
from patchset.errors import Exit
from patchset.manifest import Series, sha256_of

pytestmark = WHEEL_BUILDS

BASE = "0.5.15.post1"
LOCAL = "pdrace.2"


def build(
    out: Path, cache: Path, *args: str, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """scripts/build-wheel --out OUT ARGS, forked from the command server; fresh: in an
    interpreter of its own, for a build whose bytes are compared with another's (each process
    has its own hash seed, so an order that follows it shows as different bytes)."""
    env = dict(os.environ, SGLANG_BACKPORTS_CACHE=str(cache))
    command = [str(SCRIPTS / "build-wheel"), "--out", str(out), *args]
    if not fresh:
        return SERVER.run(command[0], command[1:], env=env)
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def built(ours: Path) -> Path:
    """The default build (the session's own, conftest's ours)."""
    return ours


@pytest.fixture(scope="module")
def original(series: Series, wheel_cache: Path) -> Path:
    return wheel_cache / series.manifest.base.wheel


def test_name_carries_the_local_label_and_the_same_tags(built: Path, original: Path):
    assert built.name == f"sglang-{BASE}+{LOCAL}-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert built.name.split("-", 2)[2] == original.name.split("-", 2)[2]


def test_same_inputs_same_bytes(built: Path, tmp_path: Path, wheel_cache: Path):
    again = build(tmp_path / "again", wheel_cache, fresh=True)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / built.name).read_bytes() == built.read_bytes()
    assert f"wheel: {tmp_path / 'again' / built.name}" in again.stdout.splitlines()
    assert f"sha256: {sha256_of(built)}" in again.stdout.splitlines()
    # --base of the primary release picks the same patch set: the same wheel
    by_base = build(tmp_path / "by-base", wheel_cache, "--base", BASE)
    assert by_base.returncode == 0, by_base.stderr
    assert (tmp_path / "by-base" / built.name).read_bytes() == built.read_bytes()


def test_only_the_patched_files_metadata_and_record_differ(
    built: Path, original: Path, series: Series
):
    assert_only_patched_differ(built, original, series)


def test_record_names_every_member_with_its_hash(built: Path):
    assert_record_right(built)


def test_record_validates_with_installer(built: Path, tmp_path: Path):
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "--quiet", "--no-deps", "--require-hashes", "-r", str(TEST_PINS))
    check = (
        "import sys\n"
        "from installer.sources import WheelFile\n"
        "with WheelFile.open(sys.argv[1]) as w:\n"
        "    w.validate_record(validate_contents=True)\n"
        "    print(w.distribution, w.version)\n"
    )
    result = subprocess.run([str(python), "-c", check, str(built)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sglang", f"{BASE}+{LOCAL}"]
    # a wheel whose RECORD hash is wrong must fail the same check (its members stored, not
    # deflated again: the check hashes each member's bytes however they are packed)
    broken = tmp_path / built.name
    with zipfile.ZipFile(built) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "sglang/srt/disaggregation/decode.py":
                data += b"# edited\n"
            dst.writestr(info, data, zipfile.ZIP_STORED)
    failed = subprocess.run([str(python), "-c", check, str(broken)], capture_output=True, text=True)
    assert failed.returncode != 0 and "decode.py" in failed.stderr


def _set_build_table(folder: Path, local: str | None = None, digest: str | None = None) -> None:
    pin = folder / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    if local is not None:
        text = re.sub(r'^local = ".*"$', f'local = "{local}"', text, flags=re.M)
    if digest is not None:
        text = re.sub(r'^series-sha256 = ".*"$', f'series-sha256 = "{digest}"', text, flags=re.M)
    pin.write_text(text, encoding="utf-8")


def _lint(folder: Path) -> subprocess.CompletedProcess[str]:
    return SERVER.run(SCRIPTS / "lint-patches", ["--patch-set", str(folder)])


def test_changed_series_without_new_label_is_refused(
    patch_set: Path, tmp_path: Path, wheel_cache: Path
):
    _set_build_table(patch_set, digest="0" * 64)
    lint = _lint(patch_set)
    assert lint.returncode == Exit.PATCHSET_INVALID
    assert "[build-wheel] [build-wheel] series-sha256 is '0000" in lint.stdout
    assert "give the wheel a new label" in lint.stdout
    result = build(tmp_path / "out", wheel_cache, "--patch-set", str(patch_set))
    assert result.returncode == Exit.PATCHSET_INVALID, result.stderr
    assert "series-sha256" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_label_must_be_a_normalized_pep440_local_label(patch_set: Path):
    _set_build_table(patch_set, local="PDRace_2")
    lint = _lint(patch_set)
    assert lint.returncode == Exit.PATCHSET_INVALID
    assert "local = 'PDRace_2' is not a PEP 440 local version label" in lint.stdout


def test_base_no_patch_set_serves(tmp_path: Path, wheel_cache: Path):
    result = build(tmp_path / "out", wheel_cache, "--base", "0.5.12")
    assert result.returncode == Exit.BASE_MISMATCH
    assert "no patch set here serves sglang '0.5.12'" in result.stderr
    assert "Traceback" not in result.stderr
