"""Test environments, made with uv: one per set of pins (requirements/<name>.txt), in
the cache folder under the digest of its files, so every clone reuses it and a changed
file gets a fresh one (docs/testing.md)."""

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.lock import marked_folder
from patchset.manifest import PinManifest
from patchset.paths import PROJECT_ROOT, cache_dir
from patchset.textout import progress

REQUIREMENTS_DIR = PROJECT_ROOT / "requirements"
UV_PINS = REQUIREMENTS_DIR / "uv.txt"
PYTHON_VERSION = (3, 11)


@dataclass(frozen=True)
class TestEnv:
    name: str
    requirements: tuple[Path, ...]

    @property
    def venv(self) -> Path:
        return cache_dir() / "venvs" / f"{self.name}-{requirements_digest(self.requirements)[:16]}"

    @property
    def python(self) -> Path:
        return venv_python(self.venv)


def env_name(manifest: PinManifest) -> str:
    """The environment of a release: its own pins, or the named stand-in the manifest gives."""
    if override := manifest.raw.get("sglang", {}).get("test-env"):
        return str(override)
    release = manifest.release
    if not release.torch or not release.transformers:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"the manifest of sglang {manifest.base.version} names no torch or transformers pin",
            "add torch = and transformers = to its [sglang] table (from the wheel's METADATA)",
        )
    torch, tf = (".".join(v.split(".")[:2]) for v in (release.torch, release.transformers))
    return f"torch{torch}-tf{tf}"


def env_for(manifest: PinManifest) -> TestEnv:
    name = env_name(manifest)
    pins = REQUIREMENTS_DIR / f"{name}.txt"
    if not pins.is_file():
        raise BackportError(
            Exit.SETUP,
            f"sglang {manifest.base.version} is tested in the environment {name}, but "
            f"{pins.relative_to(PROJECT_ROOT)} does not exist",
            "restore requirements/ from git, or add that file (see requirements/README.md)",
        )
    return TestEnv(name, (pins,))


def check_interpreter() -> None:
    if sys.version_info[:2] != PYTHON_VERSION:
        wanted = ".".join(map(str, PYTHON_VERSION))
        raise BackportError(
            Exit.ENVIRONMENT,
            f"this is Python {sys.version.split()[0]}; the pinned sglang wheels and "
            f"the requirements are for Python {wanted}",
            f"run it as python{wanted} scripts/run-tests",
        )


def requirements_digest(files: Sequence[Path]) -> str:
    """What a venv was made from: the requirement files and the Python version."""
    digest = hashlib.sha256(f"python {sys.version_info.major}.{sys.version_info.minor}\n".encode())
    for path in files:
        digest.update(f"{path.name}\n".encode() + path.read_bytes())
    return digest.hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def make_aside(final: Path, inside: Path, make: Callable[[Path], None]) -> None:
    """make() it in a marked folder, renamed to final unless another run made it (with inside)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with marked_folder(final.parent, f".{final.name}.") as tmp:
        make(tmp / final.name)
        try:
            (tmp / final.name).rename(final)
        except OSError:
            if not inside.exists():
                raise


def uv_binary() -> Path:
    """The pinned uv, installed on first use (a binary: it runs from the renamed folder)."""
    home = cache_dir() / "venvs" / f"uv-{requirements_digest([UV_PINS])[:16]}"
    uv = home / "bin" / "uv"
    if uv.is_file():
        return uv

    def make(aside: Path) -> None:
        _run_setup([sys.executable, "-m", "venv", "--clear", str(aside)], "python -m venv")
        install = [str(venv_python(aside)), "-m", "pip", "install", "--no-input", "--quiet"]
        install += ["--disable-pip-version-check", "--require-hashes", "--no-deps"]
        _run_setup([*install, "--only-binary", ":all:", "-r", str(UV_PINS)], "pip install uv")

    progress(f"installing uv into {home} (requirements/uv.txt)")
    make_aside(home, uv, make)
    return uv


def ensure_venv(
    venv: Path, requirements: Sequence[Path], what: str = "", python: str = sys.executable
) -> bool:
    """Make venv (with python) hold exactly the requirements; True when it was made anew."""
    if missing := [str(p) for p in requirements if not p.is_file()]:
        raise BackportError(
            Exit.SETUP,
            f"requirement files missing: {', '.join(missing)}",
            "restore them from git (they are part of the project)",
        )
    uv = str(uv_binary())
    created = not venv_python(venv).exists()
    if created and venv.exists():
        raise BackportError(
            Exit.SETUP,
            f"{venv} exists but is no virtual environment (it has no bin/python)",
            "remove that folder and run again",
        )
    if created:
        progress(f"making the virtual environment {venv}{f' ({what})' if what else ''}")
        make = [uv, "venv", "--quiet", "--clear", "--python", python]
        make_aside(venv, venv_python(venv), lambda made: _run_setup([*make, str(made)], "uv venv"))
    # compiled once, here: under PYTHONDONTWRITEBYTECODE every process compiles torch again
    sync = [uv, "pip", "sync", "--quiet", "--require-hashes", "--compile-bytecode"]
    _run_setup([*sync, "--python", str(venv_python(venv)), *map(str, requirements)], "uv pip sync")
    return created


def _run_setup(command: list[str], what: str) -> None:
    env = dict(os.environ, UV_CACHE_DIR=str(cache_dir() / "uv-cache"))  # read by uv alone
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env)
    except OSError as err:
        raise BackportError(
            Exit.ENVIRONMENT, f"{what} could not start: {err}", "check the Python installation"
        ) from None
    if result.returncode == 0:
        return
    output = (result.stdout + result.stderr).strip()
    if "ensurepip" in output or "No module named venv" in output:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"{sys.executable} cannot make virtual environments:\n{output[-800:]}",
            "install the venv module (on Debian and Ubuntu: apt install python3.11-venv) "
            "and run again",
        )
    raise BackportError(
        Exit.SETUP,
        f"{what} failed with exit code {result.returncode}:\n{output[-2000:]}",
        "fix what it names (often the network or the package index) and run again; "
        "the next run syncs the environment again",
    )
