"""`python -m testrun.worker JOBS.json`: pytest once per sglang tree, each in a child forked
after the heavy imports but before any sglang, so no run sees another's tree (runner.py
writes JOBS.json)."""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from treefork import fork_each, preload, use_tree


def _child(run: dict[str, Any]) -> int:
    import pytest

    os.environ.update(run["env"])
    use_tree(Path(run["tree"]))
    log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    return int(pytest.main(run["args"]))


def _started(run: dict[str, Any]) -> None:
    print(f"... {run['label']}: pytest started", flush=True)


def _ended(run: dict[str, Any], code: int, seconds: float) -> None:
    Path(run["result"]).write_text(json.dumps({"returncode": code, "seconds": seconds}), "utf-8")
    print(f"\n=== {run['label']} (pytest exit {code}) ===", flush=True)
    print(Path(run["log"]).read_text(encoding="utf-8", errors="replace"), end="", flush=True)


def main(jobs_file: str) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    jobs = json.loads(Path(jobs_file).read_text(encoding="utf-8"))
    print(f"... importing torch, transformers and the rest once ({sys.executable})", flush=True)
    print(f"worker: third-party imports took {preload():.1f}s", flush=True)
    try:
        fork_each(jobs["runs"], int(jobs.get("parallel", 1)), _child, _started, _ended)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
