"""The rehearsal's double of the lent machine's image: Python 3.12 and the image's packages.

Our test environment holds the whole import closure, so a rehearsal there would hide what
the wheelhouse lacks; the double (in the cache folder, shared) has no sgl_kernel either.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.paths import PROJECT_ROOT, cache_dir
from testrun import venv

from . import evidence

PINS = PROJECT_ROOT / "ci" / "requirements-image-double.txt"
PYTHON_VERSION = "3.12"  # the image's Python is 3.12.3


def find_python() -> str:
    """python3.12 on PATH if it runs (a shim may not), else pyenv's newest 3.12.x: nothing here
    can download one."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    pyenv = sorted(
        root.glob(f"{PYTHON_VERSION}.*/bin/python{PYTHON_VERSION}"),
        key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()],
        reverse=True,
    )
    on_path = shutil.which(f"python{PYTHON_VERSION}")
    for candidate in ([on_path] if on_path else []) + [str(p) for p in pyenv]:
        if evidence.python_version(candidate) == PYTHON_VERSION:
            return candidate
    raise BackportError(
        Exit.ENVIRONMENT,
        f"no Python {PYTHON_VERSION} runs here (python{PYTHON_VERSION} on PATH: "
        f"{on_path or 'none'}; {root}: {len(pyenv)} {PYTHON_VERSION}.x): the image double "
        "needs the image's Python",
        f"install Python {PYTHON_VERSION} (e.g. `pyenv install {PYTHON_VERSION}`) and run again",
    )


def ensure() -> Path:
    """The double's python, made (or synced to its pins) first."""
    digest = hashlib.sha256(f"python {PYTHON_VERSION}\n".encode() + PINS.read_bytes())
    folder = cache_dir() / "venvs" / f"gpu-image-double-{digest.hexdigest()[:16]}"
    venv.ensure_venv(folder, [PINS], "the lent machine's image, doubled", python=find_python())
    return venv.venv_python(folder)
