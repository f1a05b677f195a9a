"""testrun.forkserver: a command runs in a child forked from the server, as if started itself.

The servers here import nothing first (--no-preload): what is checked is the
hand-over (standard streams, working folder, environment, exit code), which
commands go through a server and which do not, and that nothing is left
behind. scripts/run-tests runs the real ones, which import torch first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SCRIPTS
from testrun import forkserver

# Run as `python -m probe` from its folder: what a command sees of its process.
PROBE = """\
import json, os, signal, sys
print(json.dumps({
    "cwd": os.getcwd(),
    "argv": sys.argv[1:],
    "stdin": sys.stdin.read(),
    "marker": os.environ.get("SGLANG_BACKPORTS_PROBE_MARKER"),
    "umask": os.umask(0),
    "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    "server_module_loaded": "testrun" in sys.modules,
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("SGLANG_BACKPORTS_PROBE_EXIT", "0")))
"""


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
    return env | {"PYTHONPATH": str(SCRIPTS)}


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A server for this interpreter (importing nothing first); the environment it serves.

    Not one of run-tests' servers, even when run-tests runs this test."""
    monkeypatch.delenv(forkserver.ENV, raising=False)
    env = server_env()
    with forkserver.serving([Path(sys.executable)], env, tmp_path / "logs", preload=False):
        yield env | {forkserver.ENV: os.environ[forkserver.ENV]}


def probe(
    tmp_path: Path, env: dict[str, str], ignore_sigint: bool = False, **extra: str
) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "work"
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    argv = forkserver.command(Path(sys.executable), "probe", ["one", "two words"], env | extra)
    return subprocess.run(
        argv,
        input="from stdin",
        capture_output=True,
        text=True,
        env=env | extra,
        cwd=folder,
        umask=0o027,
        # Either way on purpose: this test run may itself have SIGINT ignored.
        preexec_fn=lambda: signal.signal(
            signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL
        ),
    )


def test_a_command_runs_in_a_child_of_the_server_with_the_clients_streams(
    served: dict[str, str], tmp_path: Path
) -> None:
    result = probe(
        tmp_path,
        served,
        SGLANG_BACKPORTS_PROBE_MARKER="from the client",
        SGLANG_BACKPORTS_PROBE_EXIT="7",
    )

    assert result.returncode == 7, result.stderr
    seen = json.loads(result.stdout)
    assert seen["cwd"] == str(tmp_path / "work")
    assert seen["argv"] == ["one", "two words"]
    assert seen["stdin"] == "from stdin"
    assert seen["marker"] == "from the client"
    assert seen["umask"] == 0o027
    assert seen["sigint_ignored"] is False
    # A child of the server, which has the server's imports; not of the client.
    assert seen["server_module_loaded"] is True
    assert "to stderr" in result.stderr


def test_a_client_that_ignores_sigint_has_a_child_that_ignores_it(
    served: dict[str, str], tmp_path: Path
) -> None:
    """As a command started in the background of a shell: Ctrl-C is not for it."""
    result = probe(tmp_path, served, ignore_sigint=True)

    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["server_module_loaded"] is True
    assert seen["sigint_ignored"] is True


def test_a_different_environment_runs_the_command_itself(
    served: dict[str, str], tmp_path: Path
) -> None:
    """A variable that could change what gets imported: no server, the plain command."""
    argv = forkserver.command(Path(sys.executable), "probe", [], served | {"TORCH_HOME": "/x"})
    assert argv == [sys.executable, "-m", "probe"]
    result = probe(tmp_path, served, TORCH_HOME="/x", SGLANG_BACKPORTS_PROBE_EXIT="3")
    assert result.returncode == 3
    assert json.loads(result.stdout)["server_module_loaded"] is False
    # Another environment, or no server named at all: the plain command too.
    other = tmp_path / "other-env" / "bin" / "python"
    assert forkserver.command(other, "m", ["a"], served) == [str(other), "-m", "m", "a"]
    no_server = {k: v for k, v in served.items() if k != forkserver.ENV}
    assert forkserver.command(Path(sys.executable), "m", [], no_server)[1:] == ["-m", "m"]
    # Ours and pytest's variables do not count.
    same = served | {"SGLANG_BACKPORTS_STEP": "0002", "PYTEST_CURRENT_TEST": "x"}
    assert forkserver.command(Path(sys.executable), "m", [], same)[2:4] == [
        forkserver.__file__,
        "run",
    ]


def test_a_client_whose_server_is_gone_runs_the_command_itself(
    served: dict[str, str], tmp_path: Path
) -> None:
    argv = forkserver.command(Path(sys.executable), "probe", [], served)
    gone = [*argv[:4], str(tmp_path / "no-such.sock"), *argv[5:]]
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)

    result = subprocess.run(
        gone,
        capture_output=True,
        text=True,
        cwd=folder,
        env=served | {"SGLANG_BACKPORTS_PROBE_EXIT": "4"},
    )

    assert result.returncode == 4, result.stderr
    assert json.loads(result.stdout)["server_module_loaded"] is False


def test_one_server_per_environment_and_nothing_left_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(forkserver.ENV, raising=False)
    env = server_env()
    with forkserver.serving(
        [Path(sys.executable), Path(sys.executable)], env, tmp_path / "logs", preload=False
    ):
        registry = Path(os.environ[forkserver.ENV])
        servers = json.loads(registry.read_text())
        assert len(servers) == 1
        # A nested block for the same interpreter and variables starts no other.
        with forkserver.serving([Path(sys.executable)], env, tmp_path / "inner", False):
            assert json.loads(Path(os.environ[forkserver.ENV]).read_text()) == servers
            assert not (tmp_path / "inner" / "forkserver-1.log").exists()
        assert os.environ[forkserver.ENV] == str(registry)
        pids = subprocess.run(
            ["pgrep", "-f", servers[0]["socket"]], capture_output=True, text=True
        ).stdout.split()
        assert len(pids) == 1
    assert forkserver.ENV not in os.environ
    assert not registry.parent.exists()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pids[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pids[0]}").exists(), "the server outlived its block"


def test_a_killed_run_leaves_no_socket_folder(tmp_path: Path) -> None:
    """kill -9 of the process that started the servers: they end, and take their folder."""
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from testrun import forkserver\n"
        "env = dict(os.environ)\n"
        "with forkserver.serving([Path(sys.executable)], env, Path(sys.argv[1]), preload=False):\n"
        "    print(os.environ[forkserver.ENV], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = server_env()
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == -9, result.stderr
    folder = Path(result.stdout.strip()).parent
    assert folder.name.startswith("sglang-backports-fs-")
    deadline = time.monotonic() + 10
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists(), f"{folder} was left behind: {list(folder.iterdir())}"
