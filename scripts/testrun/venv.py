"""Test environments: one virtual environment per set of pins, kept while its stamp matches.

Each sglang release is tested on the torch and transformers it pins. Releases
with the same pins share an environment: requirements/<name>.txt, exact and
hashed, with the test tools (pytest, ruff) in the same file, named by the
pins (torch2.11-tf5.12, ...). The environments live in
the cache folder (beside the wheels), under a name that carries the digest
of their requirement files, so every clone on the machine reuses them and a
changed file gets a fresh one.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest
from patchset.paths import PROJECT_ROOT, cache_dir
from patchset.textout import progress

REQUIREMENTS_DIR = PROJECT_ROOT / "requirements"
STAMP_NAME = "requirements.sha256"
PYTHON_VERSION = (3, 11)


@dataclass(frozen=True)
class TestEnv:
    """A named set of pinned requirement files."""

    name: str
    requirements: tuple[Path, ...]

    @property
    def digest(self) -> str:
        return requirements_digest(self.requirements)

    @property
    def venv(self) -> Path:
        return cache_dir() / "venvs" / f"{self.name}-{self.digest[:16]}"

    @property
    def python(self) -> Path:
        return venv_python(self.venv)


def env_name(manifest: PinManifest) -> str:
    """The environment of a release: its own pins, or the named stand-in the manifest gives."""
    override = manifest.raw.get("sglang", {}).get("test-env")
    if override:
        return str(override)
    release = manifest.release
    if not release.torch or not release.transformers:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"the manifest of sglang {manifest.base.version} names no torch or transformers pin",
            "add torch = and transformers = to its [sglang] table (from the wheel's METADATA)",
        )
    return f"torch{_minor(release.torch)}-tf{_minor(release.transformers)}"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


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
    digest = hashlib.sha256()
    digest.update(f"python {sys.version_info.major}.{sys.version_info.minor}\n".encode())
    for path in files:
        digest.update(f"{path.name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path, requirements: Sequence[Path], what: str = "") -> bool:
    """Make venv hold exactly the requirements; False when its stamp says it already does.

    The stamp is written last, so an interrupted install is made afresh next time.
    """
    missing = [str(p) for p in requirements if not p.is_file()]
    if missing:
        raise BackportError(
            Exit.SETUP,
            f"requirement files missing: {', '.join(missing)}",
            "restore them from git (they are part of the project)",
        )
    stamp = venv / STAMP_NAME
    wanted = requirements_digest(requirements)
    if venv_python(venv).exists() and stamp.is_file() and stamp.read_text().strip() == wanted:
        return False
    progress(f"making the virtual environment {venv}{f' ({what})' if what else ''}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run_setup([sys.executable, "-m", "venv", "--clear", str(venv)], "python -m venv")
    install = [str(venv_python(venv)), "-m", "pip", "install", "--no-input", "--quiet"]
    install += ["--disable-pip-version-check", "--require-hashes", "--no-deps"]
    for path in requirements:
        install += ["-r", str(path)]
    _run_setup(install, "pip install")
    stamp.write_text(wanted + "\n")
    return True


def _run_setup(command: list[str], what: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
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
    if "No module named pip" in output:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"the new virtual environment has no pip:\n{output[-800:]}",
            "install pip for this Python (python3.11 -m ensurepip) and run again",
        )
    raise BackportError(
        Exit.SETUP,
        f"{what} failed with exit code {result.returncode}:\n{output[-2000:]}",
        "fix what it names (often the network or the package index) and run again; "
        "the environment is made afresh until one install succeeds",
    )
