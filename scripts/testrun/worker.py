"""Run pytest once per sglang tree, each in a child forked after the heavy imports.

    python -m testrun.worker JOBS.json

JOBS.json: {"parallel": N, "runs": [{"label", "args", "env", "tree", "log",
"result"}, ...]}. This process imports torch, transformers and the rest of
sglang's third-party closure once (testrun.preload; nothing is left to import
when it runs as a child of a testrun.forkserver), then forks a child per
run; the child sets the run's environment, puts its tree's python/ first on sys.path,
sends its output to the run's log and calls pytest.main. Each run's exit code
goes to its "result" file. A process holds only one sglang, and no sglang is
imported here before forking, so no run sees another run's tree.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .preload import preload, use_tree


def _child(run: dict[str, Any]) -> int:
    import pytest

    os.environ.update(run["env"])
    use_tree(Path(run["tree"]))
    log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    return int(pytest.main(run["args"]))


def _start(run: dict[str, Any]) -> int:
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = _child(run)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def main(jobs_file: str) -> int:
    jobs = json.loads(Path(jobs_file).read_text(encoding="utf-8"))
    runs: list[dict[str, Any]] = jobs["runs"]
    print(f"... importing torch, transformers and the rest once ({sys.executable})", flush=True)
    print(f"worker: third-party imports took {preload():.1f}s", flush=True)
    pending = list(runs)
    active: dict[int, tuple[dict[str, Any], float]] = {}
    while pending or active:
        while pending and len(active) < max(1, int(jobs.get("parallel", 1))):
            run = pending.pop(0)
            print(f"... {run['label']}: pytest started", flush=True)
            active[_start(run)] = (run, time.monotonic())
        pid, status = os.wait()
        run, started = active.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        Path(run["result"]).write_text(
            json.dumps({"returncode": code, "seconds": time.monotonic() - started}),
            encoding="utf-8",
        )
        print(f"\n=== {run['label']} (pytest exit {code}) ===", flush=True)
        sys.stdout.write(Path(run["log"]).read_text(encoding="utf-8", errors="replace"))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
