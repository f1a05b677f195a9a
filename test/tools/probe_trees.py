"""Run programs against several sglang trees from one interpreter, each as `python -c`.

    python probe_trees.py JOBS.json RESULTS.json

JOBS.json: [{"tree": DIR, "programs": {NAME: [CODE, ARG]}}, ...]; DIR/python holds
that tree's sglang. RESULTS.json gets {DIR: {NAME: {"returncode", "stdout",
"stderr"}}}.

Each program runs as `python -c CODE ARG` would run it in a process with DIR/python
on its path, and gives back what such a process gives: its exit code and what it
printed. The costly part of such a process is importing torch, transformers and
sglang, so this one imports the third-party closure once (treefork.preload), forks
a child per tree that imports that tree's sglang.srt.server_args, and forks from
that child a grandchild per program: each program starts from a clean copy of the
same imported state and leaves nothing behind for the next one.

test_check_install_config runs check-install's own ServerArgs probe through this
for every release (the command runs it with `python -c`; its end-to-end run is
tested there too).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from treefork import fork_each, preload, use_tree

PROGRAM_TIMEOUT_S = 120


def _run_program(code: str, arg: str, out: Path, err: Path) -> int:
    """In a forked grandchild: the program as `python -c code arg`; its exit code. The
    modules it imported go to out.imported, for the tree's child to import before the next."""
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    status, before = 1, set(sys.modules)
    # opened before the program runs: the probe refuses to open files outside its folder
    imported = os.open(out.with_suffix(".imported"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        sys.argv = ["-c", arg]
        # in a folder of its own, as check-install runs its probe (sglang's handlers
        # write where they run, and the probe refuses writes outside it)
        os.chdir(tempfile.mkdtemp(dir=out.parent))
        signal.alarm(PROGRAM_TIMEOUT_S)  # a program that hangs is killed, and fails
        try:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(imported, "\n".join(n for n in sys.modules if n not in before).encode())
        finally:
            os._exit(status)


def _import_quietly(names: list[str]) -> None:
    """Import names here, before forking (a program that imports one prints what it
    prints itself)."""
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        for name in names:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def _tree_child(job: dict[str, Any], results: Path) -> int:
    use_tree(Path(job["tree"]))
    # Imported here once, for every program of this tree: its server_args, then what
    # each program imported (sglang's handlers import more of it as they run).
    _import_quietly(["sglang.srt.server_args"])
    answers = {}
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        for name, (code, arg) in job["programs"].items():
            returncode = _run_program(code, arg, out, err)
            _import_quietly(out.with_suffix(".imported").read_text(encoding="utf-8").split())
            answers[name] = {
                "returncode": returncode,
                "stdout": out.read_text(encoding="utf-8", errors="replace"),
                "stderr": err.read_text(encoding="utf-8", errors="replace"),
            }
    results.write_text(json.dumps(answers), encoding="utf-8")
    return 0


def main(jobs_file: str, results_file: str) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # children ended, then us
    jobs = json.loads(Path(jobs_file).read_text(encoding="utf-8"))
    # A program that sets a variable before its imports (the probe sets HF_HUB_OFFLINE)
    # finds them made here already, with the variable unset: huggingface_hub reads it
    # once, as it is imported, and then retries the hub for a model path "m" for
    # minutes. So what the probe sets, this process sets before importing anything.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    preload()
    with tempfile.TemporaryDirectory(prefix="probe-trees-") as tmp:
        where = {job["tree"]: Path(tmp) / f"{n}.json" for n, job in enumerate(jobs)}
        codes: dict[str, int] = {}
        fork_each(
            jobs,
            1,
            lambda job: _tree_child(job, where[job["tree"]]),
            lambda _job: None,
            lambda job, code, _seconds: codes.__setitem__(job["tree"], code),
        )
        results = {
            tree: json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            for tree, path in where.items()
        }
    Path(results_file).write_text(json.dumps(results), encoding="utf-8")
    return max(codes.values(), default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
