"""The machine's facts, recorded before the GPU stages: GPU, driver, clocks, torch, triton, git."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

FILE = "facts.json"
CLOCKS = "name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw"
VERSIONS = (
    "import json, torch\n"
    "try:\n    import triton; t = triton.__version__\nexcept ImportError:\n    t = None\n"
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'triton': t,"
    " 'device': torch.cuda.get_device_name() if torch.cuda.is_available() else None}))"
)


def output(command: list[str]) -> str | None:
    """What the command printed, or None where it is missing or failed."""
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def python_version(python: str) -> str | None:
    """X.Y of the Python python names (a path or a name on PATH), or None where it fails."""
    return output([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])


def clocks() -> str | None:
    """The GPU's clocks now (idle at the start, warm after the S1 tests' warm-up), CSV."""
    return output(["nvidia-smi", f"--query-gpu={CLOCKS}", "--format=csv"])


def describe(found: dict[str, Any]) -> str:
    """The machine in one line, from what record wrote."""
    versions = found.get("versions") or {}
    return (
        f"{versions.get('device') or 'no CUDA device'}; torch {versions.get('torch')}, "
        f"triton {versions.get('triton')}; git: {found.get('git') or 'none'}"
    )


def record(python: str, reports: Path) -> tuple[bool, str]:
    """Write facts.json into reports; the stage's result line. Missing facts are said, not fatal."""
    versions = output([python, "-c", VERSIONS])
    found = {
        "nvidia_smi": output(["nvidia-smi"]),
        "clocks": clocks(),
        "python": output([python, "--version"]),
        "versions": json.loads(versions) if versions else None,
        "git": shutil.which("git"),  # `command -v git`: the runner may have none
    }
    reports.mkdir(parents=True, exist_ok=True)
    (reports / FILE).write_text(json.dumps(found, indent=2) + "\n", encoding="utf-8")
    return True, f"ok: {describe(found)}; nvidia-smi: {'yes' if found['nvidia_smi'] else 'none'}"
