"""check-install as one file: built by --zipapp, run with python3 -I -S outside the project,
on every Python sglang supports (3.10 to 3.13), where nothing is writable."""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from command_server import check_install
from conftest import SCRIPTS, SESSION_TREES
from patchset.errors import Exit

pytestmark = SESSION_TREES

LAUNCH = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
# every Python that sglang ships a wheel for; one this machine lacks fails the test
VERSIONS = ("3.10", "3.11", "3.12", "3.13")
# what the zipapp may hold besides __main__.py: check-install's code, the patchset
# modules it imports, and the release data; never another command's modules
CODE = {"scripts/launch.py", "scripts/commands/__init__.py", "scripts/commands/check_install.py"}
# lock: the ServerArgs probe's scratch folder is a marked one
PATCHSET = {
    "__init__", "errors", "cli", "paths", "catalog", "manifest", "releases",
    "tomlread", "plays", "shape", "shapeflow", "lock", "textout",
}  # fmt: skip
NEVER = {"apply", "wheel", "lint", "export", "git", "deploy", "buildtree", "docs"}
# run the zipapp as on a read-only root file system: any write, folder made, rename or
# removal is refused (an audit hook: this test runs as root, whom permissions let write)
READ_ONLY = """
import os, runpy, sys
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def hook(event, args):
    if event == "open" and (args[2] & WRITE or (args[1] and set(str(args[1])) & set("wax+"))):
        raise PermissionError(30, "Read-only file system", args[0])
    if event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link"):
        raise PermissionError(30, "Read-only file system", args[0])
sys.addaudithook(hook)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def python_of(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python"))
    if not found:
        pytest.fail(f"no Python {version} under {PYENV}: install it (pyenv install {version})")
    return found[-1]


def run(command: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def build(out: str, text: bool = False) -> subprocess.CompletedProcess[bytes]:
    if out == "-":  # the zipapp's bytes on standard output: no text to read them as
        command = [sys.executable, str(SCRIPTS / "check-install"), "--zipapp", out]
        return subprocess.run(command, capture_output=True)
    result = check_install("--zipapp", out)
    if text:
        return result  # type: ignore[return-value]
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.encode(), result.stderr.encode()
    )


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "check-install.pyz"
    built = build(str(out))
    assert built.returncode == 0, built.stdout + built.stderr
    assert out.is_file() and os.access(out, os.X_OK)
    return out


def test_same_bytes_twice_and_on_standard_output(pyz: Path, tmp_path: Path):
    again = tmp_path / "again.pyz"
    assert build(str(again)).returncode == 0
    assert again.read_bytes() == pyz.read_bytes()
    piped = build("-")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == pyz.read_bytes()
    assert b"wrote the zipapp to standard output" in piped.stderr


def test_it_holds_check_install_and_its_data_only(pyz: Path):
    names = set(zipfile.ZipFile(pyz).namelist())
    modules = {n.removeprefix("scripts/patchset/")[:-3] for n in names if "/patchset/" in n}
    assert modules <= PATCHSET, sorted(modules - PATCHSET)
    assert not modules & NEVER
    assert names >= CODE
    others = names - CODE - {"__main__.py"} - {f"scripts/patchset/{m}.py" for m in modules}
    for name in others:
        folder, _, file = name.rpartition("/")
        assert (
            (folder == "scripts/checkinstall" and file.endswith(".py"))
            or name == "patches/releases.toml"
            or (folder.startswith("patches/sglang-") and file in ("pin.toml", "series"))
        ), name


def test_every_module_it_carries_compiles_on_310(pyz: Path):
    script = (
        "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
        "[compile(z.read(n), n, 'exec') for n in z.namelist() if n.endswith('.py')]; "
        "print(sum(n.endswith('.py') for n in z.namelist()))"
    )
    result = subprocess.run(
        [str(python_of("3.10")), "-I", "-S", "-c", script, str(pyz)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == sum(n.endswith(".py") for n in zipfile.ZipFile(pyz).namelist())


@pytest.mark.parametrize(
    ("step", "args", "code"),
    [
        ("base", ["--launch-args", LAUNCH], Exit.EXPOSED),
        ("base", ["--launch-args", LAUNCH + " --disaggregation-mode prefill"], Exit.NOT_EXPOSED),
        ("base", [], Exit.AFFECTED),
        ("0001", ["--launch-args", LAUNCH], Exit.EXPOSED),
        ("0002", ["--launch-args", LAUNCH], Exit.OK),
        ("0002", ["--format", "json"], Exit.OK),
    ],
)
def test_every_python_gives_the_same_verdict(
    pyz: Path,
    tmp_path: Path,
    session_step_trees: dict[str, Path],
    step: str,
    args: list[str],
    code: Exit,
):
    tree = session_step_trees[step] / "python"
    outside, tmp = tmp_path / "elsewhere", tmp_path / "tmp"
    outside.mkdir()
    tmp.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp)}
    command = check_install("--tree", str(tree), *args, env=env, cwd=outside)
    assert "Traceback" not in command.stderr, command.stderr
    assert command.returncode == code, command.stdout + command.stderr
    for version in VERSIONS:
        python = str(python_of(version))
        alone = run([python, "-I", "-S", str(pyz), "--tree", str(tree), *args], outside, tmp)
        assert alone.returncode == code, (version, alone.stdout + alone.stderr)
        same = command.stdout.replace(sys.version.split()[0], "PY")
        assert alone.stdout.replace(python_version(python), "PY") == same, version
        launched = run(
            [python, str(SCRIPTS / "check-install"), "--tree", str(tree), *args], outside, tmp
        )
        assert launched.returncode == code and launched.stdout == alone.stdout, version
    assert list(tmp.iterdir()) == [], "something was written to TMPDIR"


@functools.cache
def python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()


def test_it_runs_where_nothing_is_writable(
    pyz: Path, tmp_path: Path, session_step_trees: dict[str, Path]
):
    tree = session_step_trees["base"] / "python"
    for version in VERSIONS:
        python = str(python_of(version))
        result = run(
            [
                python,
                "-I",
                "-S",
                "-c",
                READ_ONLY,
                str(pyz),
                "--tree",
                str(tree),
                "--launch-args",
                LAUNCH,
            ],
            tmp_path,
            tmp_path,
        )
        assert result.returncode == Exit.EXPOSED, (version, result.stdout + result.stderr)
    assert list(tmp_path.iterdir()) == []


def test_zipapp_out_is_a_regular_file_or_nothing(tmp_path: Path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    link = tmp_path / "link.pyz"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    special = [fifo]
    try:  # a character device like /dev/null, made here (root may)
        os.mknod(tmp_path / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        special.append(tmp_path / "null")
    except PermissionError:
        pass
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = [(link, "a symbolic link"), (folder, "a folder")]
    cases += [(path, "not a regular file") for path in special]
    for path, what in cases:
        before = path.lstat()
        result = build(str(path), text=True)
        assert result.returncode == Exit.ENVIRONMENT, (path, result.stderr)
        assert f"--zipapp {path}: {what}" in result.stderr and "next step:" in result.stderr
        after = path.lstat()
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), path
    assert target.read_text() == "keep me\n"
    assert list(folder.iterdir()) == []


def test_help_and_usage_error(pyz: Path, tmp_path: Path):
    shown = run([sys.executable, "-I", "-S", str(pyz), "--help"], tmp_path, tmp_path)
    assert shown.returncode == 0 and "--launch-args" in shown.stdout and " 25  " in shown.stdout
    bad = run([sys.executable, "-I", "-S", str(pyz), "--env", "NOEQUALS"], tmp_path, tmp_path)
    assert bad.returncode == Exit.USAGE and "is not NAME=VALUE" in bad.stderr
    assert [p.name for p in tmp_path.iterdir()] == []
