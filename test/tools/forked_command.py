"""Runs of the commands of scripts/, each forked from a process that imported the command once.

A fresh interpreter spends most of a short run of a command starting and importing, and
some tests start apply-patches hundreds of times (a signal at each git call). Each run
here is a child forked from a server that has made those imports; it goes on as a
started command does (launch.start, then cli.run), with that run's arguments,
environment, folder and a stdin of /dev/null, and exits with the command's code (or dies
of the signal it got). The launcher files and the interpreter's own start are what it
leaves out; the tests that start a command as a user does keep those covered.

Run as a script, this file is the server: `python forked_command.py SCRIPTS`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _child(request: dict, launch) -> int:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read from this run's TMPDIR, as a new process does
    for fd, (path, flags) in enumerate(
        [(os.devnull, os.O_RDONLY), *((p, os.O_WRONLY | os.O_CREAT) for p in request["out"])]
    ):
        os.dup2(os.open(path, flags, 0o600), fd)
    sys.argv = request["argv"]
    try:
        launch.start(request["module"])
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


def _serve(scripts: str) -> None:
    sys.path[0] = scripts  # as the launcher's own folder is, first on the path
    sys.path.insert(0, scripts)
    import launch  # holds SIGINT until launch.start, as in a started command

    replies = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        with contextlib.suppress(Exception):  # one that fails fails again in the child
            importlib.import_module("commands." + request["module"])  # once, here
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request, launch)
            finally:  # never back into this loop
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), file=replies, flush=True)


def _interrupts_delivered() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ForkedCommands:
    """A server for scripts/; run() answers as subprocess.run(capture_output=True) does.

    SIGINT interrupts each run, as typed in an interactive shell, even when this test
    run was started with SIGINT ignored or a signal blocked.
    """

    def __init__(self, scripts: Path, folder: Path) -> None:
        self.scripts = scripts
        self.folder = folder
        self.runs = 0
        self.server = subprocess.Popen(
            [sys.executable, __file__, str(scripts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_interrupts_delivered,
        )

    def run(
        self, launcher: str, *args: str, env: dict[str, str], cwd: Path
    ) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        out = [self.folder / f"run-{self.runs}.{name}" for name in ("stdout", "stderr")]
        argv = [str(self.scripts / launcher), *args]
        request = {"module": launcher.replace("-", "_"), "argv": argv, "env": env}
        request |= {"cwd": str(cwd), "out": [str(p) for p in out]}
        assert self.server.stdin and self.server.stdout
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        assert reply, "the server of forked runs ended"
        stdout, stderr = (p.read_text() for p in out)
        for path in out:
            path.unlink()
        return subprocess.CompletedProcess(argv, int(reply), stdout, stderr)

    def close(self) -> None:
        assert self.server.stdin
        self.server.stdin.close()
        self.server.wait(timeout=60)


if __name__ == "__main__":
    _serve(sys.argv[1])
