"""check-install as one file: built by --zipapp, run with python3 -I -S outside the project."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS
from patchset import paths
from patchset.errors import Exit

STEPS = paths.PROJECT_ROOT / "build" / "steps" / paths.DEFAULT_BASE
LAUNCH = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"


def run(command: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "check-install.pyz"
    built = subprocess.run(
        [sys.executable, str(SCRIPTS / "check-install"), "--zipapp", str(out)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert out.is_file() and os.access(out, os.X_OK)
    return out


def test_same_bytes_twice(pyz: Path, tmp_path: Path):
    again = tmp_path / "again.pyz"
    subprocess.run(
        [sys.executable, str(SCRIPTS / "check-install"), "--zipapp", str(again)], check=True
    )
    assert again.read_bytes() == pyz.read_bytes()


@pytest.mark.parametrize(
    ("step", "args", "code"),
    [
        ("base", ["--launch-args", LAUNCH], Exit.EXPOSED),
        ("base", ["--launch-args", LAUNCH + " --disaggregation-mode prefill"], Exit.NOT_EXPOSED),
        ("base", [], Exit.AFFECTED),
        ("0001", ["--launch-args", LAUNCH], Exit.EXPOSED),
        ("0002", ["--launch-args", LAUNCH], Exit.OK),
    ],
)
def test_same_verdicts_as_the_command(
    pyz: Path, tmp_path: Path, step: str, args: list[str], code: Exit
):
    tree = STEPS / step / "python"
    if not tree.is_dir():
        pytest.skip(f"needs {tree}: run scripts/run-tests once")
    outside, tmp = tmp_path / "elsewhere", tmp_path / "tmp"
    outside.mkdir()
    tmp.mkdir()
    alone = run([sys.executable, "-I", "-S", str(pyz), "--tree", str(tree), *args], outside, tmp)
    command = run(
        [sys.executable, str(SCRIPTS / "check-install"), "--tree", str(tree), *args], outside, tmp
    )
    assert alone.returncode == command.returncode == code, alone.stdout + alone.stderr
    assert alone.stdout == command.stdout
    assert list(tmp.iterdir()) == [], "the zipapp left its unpacked copy behind"


def test_help_and_usage_error(pyz: Path, tmp_path: Path):
    shown = run([sys.executable, "-I", "-S", str(pyz), "--help"], tmp_path, tmp_path)
    assert shown.returncode == 0 and "--launch-args" in shown.stdout and " 25  " in shown.stdout
    bad = run([sys.executable, "-I", "-S", str(pyz), "--env", "NOEQUALS"], tmp_path, tmp_path)
    assert bad.returncode == Exit.USAGE and "is not NAME=VALUE" in bad.stderr
    assert [p.name for p in tmp_path.iterdir()] == []
