"""Run a command of scripts/ as `python scripts/NAME ARGS` runs it (or pip as `python -m pip
ARGS`), in a child forked from one interpreter that has imported the command's modules already.

    python command_server.py SCRIPTS   (a JSON request a line on stdin, an answer a line out)

Some tests start a command hundreds of times (check-install's cases, a signal at each git
call, the damaged manifests), and a fresh interpreter spends most of a short run starting
and importing (a third of a second here). A request {"script" or "module", "args", "env",
"cwd", "timeout"} gets {"returncode", "stdout", "stderr"}: the child takes the request's
environment, folder, argv and sys.path (the script's folder or the current one, then
PYTHONPATH's), stdin from /dev/null and its output into files, runs the script or module as
__main__, and ends as an interpreter ends (threads joined, atexit run). SIGINT interrupts it
as typed in an interactive shell, even when the tests run with SIGINT ignored or blocked.
The tests that start a command as a user does (the launcher, the zipapp on four Pythons, a
Ctrl-C during the interpreter's start) still run real processes.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
PIP_MODULES = ["pip._internal.cli.main", "pip._internal.cli.main_parser"]


def _child(request: dict[str, Any], out: int, err: int, base_path: list[str]) -> None:
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        tempfile.tempdir = None  # read from TMPDIR again, as a new process would
        atexit._clear()  # the server's are not the command's
        script, module = request.get("script"), request.get("module")
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        first = os.path.dirname(script) if script else os.getcwd()
        sys.path[:] = [first, *extra, *base_path]
        sys.argv = [script or "-m", *request["args"]]
        if request["timeout"]:  # killed, as subprocess.run(timeout=...) kills
            signal.alarm(max(1, round(request["timeout"])))
        try:
            if script:
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int | None):
                print(done.code, file=sys.stderr)
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's end
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _preload(request: dict[str, Any], scripts: Path) -> None:
    """What the request's command imports, imported here once for every later child; launch
    holds SIGINT as it is imported, as in the command's own process (start() releases it).
    A server serves one scripts/ folder: its modules are the ones it has imported."""
    script = request.get("script")
    names = PIP_MODULES if request.get("module") == "pip" else []
    if script and Path(script).parent == scripts:
        names = ["launch", "commands." + Path(script).name.replace("-", "_")]
    sys.path.insert(0, str(scripts))
    for name in names:
        with contextlib.suppress(Exception):  # one that fails fails again in the child
            importlib.import_module(name)
    del sys.path[0]


def _serve(scripts: Path) -> None:
    base_path = sys.path[1:]  # without this file's folder
    tmp = Path(tempfile.mkdtemp(prefix="command-server-"))
    out_file, err_file = tmp / "out", tmp / "err"
    try:
        for line in sys.stdin:
            request = json.loads(line)
            _preload(request, scripts)
            out = os.open(out_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, out, err, base_path)
            os.close(out)
            os.close(err)
            status = os.waitpid(pid, 0)[1]
            answer = {
                "returncode": os.waitstatus_to_exitcode(status),
                "stdout": out_file.read_bytes().decode(),
                "stderr": err_file.read_bytes().decode(),
            }
            print(json.dumps(answer), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _interrupts_delivered() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CommandServer:
    """The test process's side: a server of one scripts/ folder, started on first use."""

    def __init__(self, scripts: Path = SCRIPTS) -> None:
        self.scripts = scripts
        self.proc: subprocess.Popen[str] | None = None

    def stop(self) -> None:
        """End the server (its stdin closed) and wait for it."""
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def run(
        self,
        script: Path | str,
        args: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """As subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
        env=env, cwd=cwd, timeout=timeout); a script "-m NAME" runs the module NAME."""
        if self.proc is None or self.proc.poll() is not None:
            server_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.scripts)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=server_env,
                preexec_fn=_interrupts_delivered,
            )
            atexit.register(self.stop)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        name = str(script)
        module = name.removeprefix("-m ") if name.startswith("-m ") else None
        request = {
            "script": None if module else name,
            "module": module,
            "args": [str(a) for a in args],
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or os.getcwd()),
            "timeout": timeout,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the command server ended (what it said is in this test's output)"
        answer = json.loads(line)
        command = [sys.executable, *(["-m", module] if module else [name]), *request["args"]]
        if answer["returncode"] == -signal.SIGALRM and timeout:
            raise subprocess.TimeoutExpired(command, timeout, answer["stdout"], answer["stderr"])
        text = {k: _universal(answer[k]) for k in ("stdout", "stderr")}
        return subprocess.CompletedProcess(command, answer["returncode"], **text)


def _universal(text: str) -> str:
    """Newlines as text=True reads them."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


SERVER = CommandServer()  # this project's scripts/, one per process (an xdist worker)


def check_install(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """scripts/check-install ARGS, run as by subprocess.run (see CommandServer.run)."""
    return SERVER.run(SCRIPTS / "check-install", list(args), env=env, cwd=cwd, timeout=timeout)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
