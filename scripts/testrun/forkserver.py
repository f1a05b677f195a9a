"""A process that imports torch and the rest once and forks a child per command.

    python -m testrun.forkserver serve SOCKET [--no-preload]
    python -m testrun.forkserver run SOCKET MODULE [ARG ...]

scripts/run-tests starts one server per test environment for the length of
the run and names them in SGLANG_BACKPORTS_FORKSERVER (a JSON file). Every
command of ours that would start `python -m MODULE ...` in one of those
environments (the step-suite worker, the race checker's worker, pytest on
test/tools, and so the commands the tools' tests run in their turn) asks
command() for its argv: when a server serves that interpreter with the same
environment, the argv is a small client ("run") instead, which hands the
server its standard input, output and error and the command; the server forks
a child that takes them over, moves to the client's working folder and
environment, runs the module as __main__ and sends back its exit code, which
the client exits with. Without a matching server (or when its socket is gone)
the command runs as `python -m MODULE ...` of its own: the server saves only
time, each environment importing torch once per run of run-tests instead of
once per command (about 7 s of a core each on a quiet host, five times that
on a busy one).

The server ends when its standard input closes (run-tests ends, or dies).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

ENV = "SGLANG_BACKPORTS_FORKSERVER"
# Variables that may differ between a server's environment and a command's
# without changing what a fresh interpreter would import: pytest's own, ours
# (the step, the tree, the build and cache folders, the registry: all read
# when used, none when a module is imported) and the shell's bookkeeping.
IGNORED_PREFIXES = ("PYTEST_", "SGLANG_BACKPORTS_")
IGNORED = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
SCRIPTS = Path(__file__).resolve().parent.parent
_LENGTH = struct.Struct("!I")
_CODE = struct.Struct("!i")


def _significant(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in IGNORED and not k.startswith(IGNORED_PREFIXES)}


def _environment(python: Path) -> str:
    """The environment a python binary belongs to: its bin/ folder's parent, resolved.

    Not the binary resolved: a venv's python links to the interpreter it was
    made from, which every venv made from it shares.
    """
    return os.path.realpath(Path(python).absolute().parent.parent)


def _matches(server: Mapping[str, Any], python: Path, env: Mapping[str, str]) -> bool:
    """Would `python -m ...` with env import what the server has imported?

    The same environment and scripts/ folder, and the same variables but for
    IGNORED ones; PYTHONPATH may also be unset, as pytest.ini puts scripts/
    on the path anyway.
    """
    if server["environment"] != _environment(python) or server["scripts"] != str(SCRIPTS):
        return False
    ours, theirs = _significant(env), _significant(server["env"])
    if "PYTHONPATH" not in ours:
        theirs.pop("PYTHONPATH", None)
    return ours == theirs


def _registered(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The servers named in env[ENV] (none when it names no readable registry)."""
    registry = env.get(ENV)
    if not registry:
        return []
    try:
        servers = json.loads(Path(registry).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return servers if isinstance(servers, list) else []


def command(python: Path, module: str, args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The argv that runs `python -m module args` with env: through a server if one fits."""
    for server in _registered(env):
        if _matches(server, python, env) and os.path.exists(server["socket"]):
            # -I: the client needs only the standard library, and nothing of
            # testrun/ (next to this file) or of PYTHON* variables gets in its way.
            return [str(python), "-I", __file__, "run", server["socket"], module, *args]
    return [str(python), "-m", module, *args]


# --- the client ---------------------------------------------------------------


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def client(sock_path: str, module: str, args: list[str]) -> int:
    """Have the server run module with args on our stdio, cwd, umask and environment."""
    umask = os.umask(0)
    os.umask(umask)
    request = json.dumps(
        {
            "module": module,
            "args": args,
            "cwd": os.getcwd(),
            "umask": umask,
            # A process started with SIGINT ignored (in the background of a
            # shell without job control) keeps ignoring it; so does the child.
            "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
            "env": dict(os.environ),
        }
    ).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        socket.send_fds(conn, [_LENGTH.pack(len(request))], [0, 1, 2])
        conn.sendall(request)
    except OSError:
        # No server there (any more), or a standard stream is closed: run the
        # command in this process's place instead.
        conn.close()
        os.execv(sys.executable, [sys.executable, "-m", module, *args])
    try:
        reply = _recv_exact(conn, _CODE.size)
    except KeyboardInterrupt:
        return 130  # the child had the same signal, as it shares our process group
    if len(reply) < _CODE.size:
        print(
            f"forkserver: the child running {module} ended without an exit code",
            file=sys.stderr,
        )
        return 1
    return int(_CODE.unpack(reply)[0])


# --- the server ---------------------------------------------------------------


def _reopen_stdio() -> None:
    """sys.stdin/stdout/stderr on the client's streams, buffered as a new interpreter's.

    Standard output is line-buffered on a terminal and block-buffered
    otherwise; standard error is always line-buffered.
    """
    encoding, errors = sys.stdout.encoding, sys.stdout.errors

    def stream(fd: int, mode: str, errors: str, line: bool) -> TextIO:
        # Not closed: they serve the process until it ends, as sys's own do.
        return open(
            fd, mode, buffering=1 if line else -1, encoding=encoding, errors=errors, closefd=False
        )

    sys.stdin = sys.__stdin__ = stream(0, "r", errors, False)
    sys.stdout = sys.__stdout__ = stream(1, "w", errors, os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "w", "backslashreplace", True)


def _run_request(conn: socket.socket) -> int:
    """In a forked child: take over the client's stdio, cwd and environment, run, reply."""
    head, fds, _flags, _addr = socket.recv_fds(conn, _LENGTH.size, 3)
    head += _recv_exact(conn, _LENGTH.size - len(head))
    request = json.loads(_recv_exact(conn, _LENGTH.unpack(head)[0]))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _reopen_stdio()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(
        signal.SIGINT,
        signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler,
    )
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    # What `python -m` puts first on the path: the working folder.
    sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["args"]]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        if ended.code is None or isinstance(ended.code, int):
            code = ended.code or 0
        else:
            print(ended.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # What a normal exit of that interpreter would do, without the server's loop.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        conn.sendall(_CODE.pack(code))
    return code


def serve(sock_path: str, preload_first: bool = True) -> int:
    """Listen on sock_path, import torch and the rest, then fork a child per client."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)  # clients that come during the imports wait here
    try:
        if preload_first:
            from .preload import preload

            print(f"forkserver: third-party imports took {preload():.1f}s", flush=True)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
        while True:
            ready, _, _ = select.select([listener, sys.stdin.fileno()], [], [])
            if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 4096):
                return 0
            if listener in ready:
                conn, _ = listener.accept()
                if os.fork() == 0:
                    # The child never returns to this loop, whatever happens in it.
                    code = 1
                    try:
                        listener.close()
                        code = _run_request(conn)
                    finally:
                        os._exit(code)
                conn.close()
    except KeyboardInterrupt:
        return 130
    finally:
        with contextlib.suppress(OSError):
            os.unlink(sock_path)
        _remove_folder_if_last(Path(sock_path).parent)


def _remove_folder_if_last(folder: Path) -> None:
    """The socket folder, once no server's socket is left in it (run-tests was killed)."""
    if any(folder.glob("*.sock")):
        return
    with contextlib.suppress(OSError):
        (folder / "servers.json").unlink(missing_ok=True)
        folder.rmdir()


@contextlib.contextmanager
def serving(
    pythons: Sequence[Path], env: Mapping[str, str], logs: Path, preload: bool = True
) -> Iterator[None]:
    """A server per interpreter, named in os.environ[ENV] until the block ends.

    An interpreter that a server named in os.environ[ENV] already serves with
    env (run-tests run by a test of run-tests) gets no second one. Each new
    server's output goes to logs/forkserver-N.log; the servers and their
    socket folder are gone when the block ends, whatever ended it. With
    preload False the servers import nothing first (for checks of this module).
    """
    folder = Path(tempfile.mkdtemp(prefix="sglang-backports-fs-"))
    servers: list[tuple[subprocess.Popen[bytes], str]] = []  # each with its socket
    registry = _registered(os.environ)
    previous = os.environ.get(ENV)
    try:
        logs.mkdir(parents=True, exist_ok=True)
        if not registry:  # a run of its own: the logs of an earlier one go
            for stale in logs.glob("forkserver-*.log"):
                stale.unlink()
        for python in dict.fromkeys(pythons):
            if any(_matches(server, python, env) for server in registry):
                continue
            n = len(servers) + 1
            sock_path = str(folder / f"{n}.sock")
            with (logs / f"forkserver-{n}.log").open("wb") as log:
                server = subprocess.Popen(
                    [str(python), "-m", "testrun.forkserver", "serve", sock_path]
                    + ([] if preload else ["--no-preload"]),
                    env=dict(env),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            servers.append((server, sock_path))
            registry.append(
                {
                    "environment": _environment(python),
                    "scripts": str(SCRIPTS),
                    "socket": sock_path,
                    "env": dict(env),
                }
            )
        # Each binds its socket before importing anything; a server that ended
        # instead is left out, and its commands run by themselves.
        deadline = time.monotonic() + 60
        for server, sock_path in servers:
            while (
                not os.path.exists(sock_path)
                and server.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
        registry = [entry for entry in registry if os.path.exists(entry["socket"])]
        (folder / "servers.json").write_text(json.dumps(registry), encoding="utf-8")
        os.environ[ENV] = str(folder / "servers.json")
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
        for server, _ in servers:
            assert server.stdin is not None
            with contextlib.suppress(OSError):
                server.stdin.close()
        for server, _ in servers:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        return serve(argv[1], preload_first="--no-preload" not in argv[2:])
    if len(argv) >= 3 and argv[0] == "run":
        return client(argv[1], argv[2], argv[3:])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
