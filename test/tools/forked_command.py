"""Many runs of one command of scripts/, each forked from a process that imported it once.

The signal-at-every-git-call loops start apply-patches a few hundred times, and a fresh
interpreter spends most of such a run starting and importing. Each run here is a child
forked from a server that has made those imports; it goes on as a started command does
(launch.start, then cli.run), with that run's arguments, environment, folder and stdin
of /dev/null, and exits with the command's code (or dies of the signal it got).

Run as a script, this file is the server: `python forked_command.py SCRIPTS MODULE`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path


def _child(request: dict, module: str, launch) -> int:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (path, flags) in enumerate(
        [(os.devnull, os.O_RDONLY), *((p, os.O_WRONLY | os.O_CREAT) for p in request["out"])]
    ):
        os.dup2(os.open(path, flags, 0o600), fd)
    sys.argv = request["argv"]
    try:
        launch.start(module)
    except SystemExit as done:
        code = done.code
    except BaseException:  # as the interpreter ends a run that raised
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what a started command's interpreter runs as it exits
    if not isinstance(code, int | None):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code or 0


def _serve(scripts: str, module: str) -> None:
    sys.path[0] = scripts  # as the launcher's own folder is, first on the path
    sys.path.insert(0, scripts)
    import importlib

    import launch  # holds SIGINT until launch.start, as in a started command

    importlib.import_module("commands." + module)
    replies = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(json.loads(line), module, launch)
            finally:  # never back into this loop
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), file=replies, flush=True)


class ForkedCommand:
    """A server for scripts/<launcher>; run() answers as subprocess.run(capture_output) does."""

    def __init__(self, scripts: Path, launcher: str, folder: Path) -> None:
        self.launcher = str(scripts / launcher)
        self.folder = folder
        self.runs = 0
        self.server = subprocess.Popen(
            [sys.executable, __file__, str(scripts), launcher.replace("-", "_")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # SIGINT interrupts the command, as typed in an interactive shell, even
            # when this test run was started with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def run(self, *args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        out = [self.folder / f"run-{self.runs}.{name}" for name in ("stdout", "stderr")]
        request = {"argv": [self.launcher, *args], "env": env, "cwd": str(cwd)}
        assert self.server.stdin and self.server.stdout
        self.server.stdin.write(json.dumps(request | {"out": [str(p) for p in out]}) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        assert reply, "the server of forked runs ended"
        stdout, stderr = (p.read_text() for p in out)
        return subprocess.CompletedProcess(request["argv"], int(reply), stdout, stderr)

    def close(self) -> None:
        assert self.server.stdin
        self.server.stdin.close()
        self.server.wait(timeout=60)


if __name__ == "__main__":
    _serve(*sys.argv[1:])
