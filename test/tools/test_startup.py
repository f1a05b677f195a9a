"""Every command starts cleanly: an old Python gets exit 16, a Ctrl-C while starting exit 130.

The launchers in scripts/ and scripts/launch.py are the only code an old
Python reads, so they are checked with the real old interpreters where this
machine has them (pyenv keeps several); a Ctrl-C is sent at many moments of a
real start, from the interpreter's first imports to the command's own work.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import exit_codes as docs
import pytest
from conftest import SCRIPTS, make_venv
from patchset.errors import Exit

COMMANDS = docs.LAUNCHERS
OLD_PYTHONS = ["2.7", "3.6", "3.9", "3.10"]
# check-install runs on 3.10 (pods with only Ubuntu 22.04's python3); the rest need 3.11
FLOOR = {"check-install": (3, 10)}


def old_python(version: str) -> str | None:
    """An interpreter of that version that runs: in pyenv's folder, or on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = (
        sorted(str(p / "bin" / "python") for p in root.glob(f"{version}.*"))
        if root.is_dir()
        else []
    )
    found.append(shutil.which(f"python{version}") or "")
    for python in found:
        if python and subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def test_every_command_is_a_link_to_the_launcher_and_has_a_module():
    assert "apply-patches" in COMMANDS and "check-install" in COMMANDS
    launcher = SCRIPTS / "launch.py"
    assert launcher.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(launcher, os.X_OK)
    for name in COMMANDS:
        assert os.readlink(SCRIPTS / name) == "launch.py", name
        assert (SCRIPTS / "commands" / f"{name.replace('-', '_')}.py").is_file(), name


def test_a_link_of_another_name_or_a_copy_runs_its_command(tmp_path: Path):
    # a link on PATH under a name of its own; a copy of scripts/ that follows the links
    (tmp_path / "sgl-apply").symlink_to(SCRIPTS / "apply-patches")
    copy = tmp_path / "copy"
    shutil.copytree(SCRIPTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not (copy / "lint-patches").is_symlink()
    for program, usage in (
        (tmp_path / "sgl-apply", "usage: apply-patches"),
        (copy / "lint-patches", "usage: lint-patches"),
    ):
        result = subprocess.run([sys.executable, program, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout.startswith(usage), result.stderr


@pytest.mark.parametrize("name", ["launch.py", "no-such-command"])
def test_a_name_that_is_no_command_is_refused(name: str, tmp_path: Path):
    program = SCRIPTS / name
    if name != "launch.py":
        program = tmp_path / name
        program.symlink_to(SCRIPTS / "launch.py")
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    assert result.returncode == Exit.USAGE
    assert f"error: {program} is not a command of {SCRIPTS}" in result.stderr
    assert "next step:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("version", OLD_PYTHONS)
def test_an_old_python_is_told_which_it_needs(version: str, tmp_path: Path):
    python = old_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    for name in COMMANDS:
        result = subprocess.run(
            [python, str(SCRIPTS / name), "--help"], capture_output=True, text=True, cwd=tmp_path
        )
        floor = FLOOR.get(name, (3, 11))
        if tuple(map(int, version.split("."))) >= floor:
            assert result.returncode == Exit.OK and "exit codes:" in result.stdout, result.stderr
            continue
        assert result.returncode == Exit.ENVIRONMENT, (name, result.stderr)
        assert f"needs Python {floor[0]}.{floor[1]} or newer" in result.stderr, name
        assert "next step:" in result.stderr
        assert "Traceback" not in result.stderr and "SyntaxError" not in result.stderr, name


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def timed_run(command: list[str], env: dict[str, str], cwd: Path) -> float:
    begin = time.monotonic()
    subprocess.run(command, env=env, cwd=cwd, capture_output=True)
    return time.monotonic() - begin


def in_the_interpreters_own_start(returncode: int, stderr: str) -> bool:
    """The signal came before any code of ours ran: Python's own initialisation
    (no handler yet: killed by SIGINT, or a fatal error in its first imports), its
    look at whether the script is a zip archive (main.c's "Failed checking if argv[0]
    is an import path entry") or its making of the script's loader (pythonrun.c's
    "python: failed to set __main__.__loader__"), each printed before the script's
    first line runs."""
    return returncode == -signal.SIGINT or stderr.startswith(
        (
            "Fatal Python error",
            "Failed checking if argv[0] is an import path entry",
            "python: failed to set __main__.__loader__",
        )
    )


@pytest.mark.parametrize("name", ["apply-patches", "check-install", "lint-patches"])
def test_ctrl_c_at_any_moment_of_the_start_is_one_line_and_130(name: str, tmp_path: Path):
    """A SIGINT at 16 moments spread from the end of a bare interpreter start
    to the end of a whole run. The interpreter's own start comes before any
    program's code and is out of its reach: a signal that lands there (seen
    as Python's own death) is told apart and not counted. The commands run
    without site imports (-S: they need nothing from site-packages), which
    keeps that start short. check-install asks an empty venv of this Python
    whose start sleeps 0.2 s (a .pth line): the same probe and the same answer
    (no sglang) as this venv, whose hundred distributions take CPU seconds to
    read; with the sleep, many of the 16 moments still land while the command
    waits for that child, as they did, at no CPU cost."""
    if name == "check-install":
        python = make_venv(tmp_path / "empty-venv")
        (site,) = (tmp_path / "empty-venv" / "lib").glob("python3*/site-packages")
        (site / "slow-start.pth").write_text("import time; time.sleep(0.2)\n")
        args = ["--python", str(python)]
    else:
        args = {"apply-patches": ["--check"], "lint-patches": []}[name]
    # its own TMPDIR: a neighbour's hold on the shared temporary-folder lock is not this test's
    env = dict(os.environ, SGLANG_BACKPORTS_BUILD=str(tmp_path / "build"), TMPDIR=str(tmp_path))
    command = [sys.executable, "-S", str(SCRIPTS / name), *args]
    bare = min(timed_run([sys.executable, "-S", "-c", "pass"], env, tmp_path) for _ in range(3))
    whole = timed_run(command, env, tmp_path)
    outcomes = []
    for step in range(16):
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
            preexec_fn=_default_sigint,
        )
        time.sleep(bare + max(whole - bare, 0.05) * step / 16)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        if in_the_interpreters_own_start(proc.returncode, stderr):
            continue
        assert "Traceback" not in stderr, (step, stderr)
        if proc.returncode == Exit.INTERRUPTED:
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("interrupted"), (step, stderr)
        else:  # it ended before the signal came, with its own code, not killed by it
            assert proc.returncode >= 0, (step, stderr)
        outcomes.append(proc.returncode)
    assert Exit.INTERRUPTED in outcomes, outcomes


# CPython rewrites an exception raised inside a codec into one of the same type whose text
# is the codec's: "decoding with 'cp437' codec failed (KeyboardInterrupt: SIGTERM)" (a
# SIGTERM while zipfile decodes a member's name, as build-wheel met it).
IN_A_CODEC = """
import signal, sys
sys.path.insert(0, sys.argv[1])
from patchset import cli

def main():
    try:
        cli._terminate(signal.SIGTERM, None)
    except KeyboardInterrupt as raised:
        wrapped = f"decoding with 'cp437' codec failed (KeyboardInterrupt: {raised})"
        raise KeyboardInterrupt(wrapped) from None

cli.run(main)
"""


def test_a_signal_met_inside_a_codec_is_still_named() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IN_A_CODEC, str(SCRIPTS)], capture_output=True, text=True
    )
    assert done.returncode == Exit.INTERRUPTED, done.stderr
    assert done.stderr == "interrupted (SIGTERM); what this run made was removed\n"
