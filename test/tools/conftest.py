"""Shared fixtures for the tests of the commands in scripts/.

These tests run once (not per step), with the project's venv python. The
pinned wheels are fetched through the project's own hash-checked path into
the shared cache, once per run, and every test reuses them; a test that
needs a wheel which is not cached is marked `network` and, offline, skips
saying so. Nothing here writes into the project's build/: the whole session
gets a build folder of its own.

scripts/run-tests runs them under pytest-xdist (--dist loadgroup). Each
session fixture is made once per worker, so the files that share the costly
ones carry one xdist_group mark (SESSION_TREES, TORCH_IN_PROCESS, WHEEL_BUILDS) and
run on one worker; every other file is a group of its own, so that its module
fixtures are made once too.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from command_server import SERVER
from patchset import apply, buildtree, lock, paths, wheel
from patchset.errors import BackportError, Exit
from patchset.lint import series_sha256
from patchset.manifest import PinManifest, Series, WheelPin, sha256_of

SCRIPTS = paths.PROJECT_ROOT / "scripts"
# Tools the tests install into scratch environments, exact and hashed.
TEST_PINS = SCRIPTS.parent / "requirements" / "test.txt"
NETWORK_FIXTURES = {"wheel_cache", "upstream_fixed_wheel", "run_script", "ours"}
# The files that use the session's build tree and step trees, our wheel and what
# pip installs from it.
SESSION_TREES = pytest.mark.xdist_group("session-trees")
# The files that import torch (and the racecheck modules over it) in the test process.
TORCH_IN_PROCESS = pytest.mark.xdist_group("torch-in-process")
# The files of build-wheel's own tests, which share the session's default build (ours).
WHEEL_BUILDS = pytest.mark.xdist_group("wheel-builds")


def pytest_configure(config: pytest.Config) -> None:
    """The session's own build folder, so no test writes into the project's build/."""
    if "SGLANG_BACKPORTS_BUILD" not in os.environ:
        os.environ["SGLANG_BACKPORTS_BUILD"] = tempfile.mkdtemp(prefix="sglang-backports-tests-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("SGLANG_BACKPORTS_BUILD"), True))


def pytest_sessionstart(session: pytest.Session) -> None:
    """The bytecode of scripts/ and ci/, written once before xdist starts its workers.

    This machine sets PYTHONDONTWRITEBYTECODE, so every command a test starts would
    compile the modules it imports again (a third of a short command's CPU time).
    """
    if not hasattr(session.config, "workerinput"):
        for folder in (SCRIPTS, SCRIPTS.parent / "ci"):
            compileall.compile_dir(folder, quiet=2)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if NETWORK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.network)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.fixture(autouse=True)
def signals_delivered() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP reach this process and what it starts.

    An apply that succeeds holds them for the rest of its process
    (patchset.lock.hold_interrupts), and a blocked signal stays blocked in
    every process started after it. A session fixture that applies here
    (session_step_trees) would leave this worker, and every command the later
    tests start from it, deaf to the signals they send; so they are released
    before each test (after the session fixtures it uses) and after it.
    """
    lock.release_interrupts()
    yield
    lock.release_interrupts()


def fetch_or_skip(pin: WheelPin, cache: Path) -> Path:
    """The pinned wheel; offline and not cached, the test skips and says why."""
    try:
        return wheel.fetch_wheel(pin, cache)
    except BackportError as err:
        if err.code != Exit.WHEEL_UNAVAILABLE:
            raise
        pytest.skip(f"needs the package index (network): {err.problem}")


RunScript = Callable[..., subprocess.CompletedProcess[str]]


def make_venv(folder: Path, python: Path = Path(sys.executable)) -> Path:
    """A scratch virtual environment of python, without a pip of its own (see pip);
    returns its python."""
    subprocess.run(
        [str(python), "-m", "venv", "--without-pip", str(folder)],
        check=True,
        capture_output=True,
    )
    return folder / "bin" / "python"


def pip(
    python: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pip acting on python's environment; fails the test with pip's output when pip fails.

    This environment's pip drives the other one (pip --python), so a scratch venv
    needs no pip installed into it first (ensurepip takes seconds); it runs forked from
    the command server, and pip runs again in python's own process, as --python does.
    """
    more = ["--python", str(python), "--disable-pip-version-check", *args]
    result = SERVER.run("-m pip", more, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="session")
def series() -> Series:
    """The real patch set, pinned to sglang 0.5.15.post1."""
    return Series.load(paths.DEFAULT_PATCH_DIR)


@pytest.fixture(scope="session")
def wheel_cache(series: Series) -> Path:
    """The shared wheel cache, holding the pinned base wheel (downloaded once)."""
    cache = paths.cache_dir()
    fetch_or_skip(series.manifest.base, cache)
    return cache


@pytest.fixture(scope="session")
def upstream_fixed_wheel(series: Series, wheel_cache: Path) -> Path:
    """The first release with both fixes (0.5.19), through the same pinned path."""
    return fetch_or_skip(series.manifest.registry.upstream_fixed, wheel_cache)


@pytest.fixture(scope="session")
def session_step_trees(series: Series, wheel_cache: Path) -> dict[str, Path]:
    """The default series applied in this session's build folder; step -> its tree."""
    build = paths.build_dir()
    apply.apply_to_build_tree(series, build, wheel_cache)
    return buildtree.step_trees(series, build)


@pytest.fixture(scope="session")
def patched_tree(series: Series, session_step_trees: dict[str, Path]) -> Path:
    """The final step's tree of the session's build folder."""
    return session_step_trees[series.manifest.final_step]


@pytest.fixture(scope="session")
def ours(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path) -> Path:
    """Our patched wheel of the default release, as scripts/build-wheel writes it."""
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, SGLANG_BACKPORTS_CACHE=str(wheel_cache))
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "build-wheel"), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    found = re.search(r"^wheel: (.+)$", result.stdout, re.M)
    assert found, result.stdout
    return Path(found[1])


@pytest.fixture(scope="session")
def installed_tree(tmp_path_factory: pytest.TempPathFactory, ours: Path) -> Path:
    """A folder whose python/ is what pip installs from our wheel (pip --target)."""
    tree = tmp_path_factory.mktemp("installed")
    pip(
        Path(sys.executable),
        "install", "--no-deps", "--no-index", "--no-compile", "--quiet",
        "--target", str(tree / "python"), str(ours),
    )  # fmt: skip
    return tree


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _script_env(tmp_path: Path, wheel_cache: Path, env: dict[str, str] | None) -> dict[str, str]:
    """A command's environment in a test: a private build folder, the shared wheel cache."""
    build = {"SGLANG_BACKPORTS_BUILD": str(tmp_path / "build")}
    return {**os.environ, **build, "SGLANG_BACKPORTS_CACHE": str(wheel_cache), **(env or {})}


@pytest.fixture
def run_script(tmp_path: Path, wheel_cache: Path) -> RunScript:
    """Run scripts/NAME with a private build folder and the shared wheel cache."""

    def run(
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        interruptible: bool = False,
    ):
        """interruptible: SIGINT interrupts the command, as typed in an interactive
        shell, even when this test run was started with SIGINT ignored (in the
        background of a shell, which a started command would inherit)."""
        full_env = _script_env(tmp_path, wheel_cache, env)
        return subprocess.run(
            [sys.executable, str(SCRIPTS / name), *args],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=cwd or tmp_path,
            preexec_fn=_default_sigint if interruptible else None,
        )

    return run


@pytest.fixture
def forked_script(tmp_path: Path, wheel_cache: Path) -> RunScript:
    """run_script, each run forked from the command server (always interruptible): for
    the tests that start a command many times; each command keeps tests that start it."""

    def run(
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        interruptible: bool = True,  # every forked run is
    ):
        full_env = _script_env(tmp_path, wheel_cache, env)
        return SERVER.run(SCRIPTS / name, list(args), env=full_env, cwd=cwd or tmp_path)

    return run


@dataclass(frozen=True)
class SlimSet:
    """A slim copy of the default patch set (slim_patch_set), and the env that finds its wheel."""

    folder: Path
    env: dict[str, str]


@pytest.fixture
def slim_set(tmp_path: Path, series: Series, wheel_cache: Path) -> SlimSet:
    folder, cache = slim_patch_set(series, wheel_cache, tmp_path / "slim")
    return SlimSet(folder, {"SGLANG_BACKPORTS_CACHE": str(cache)})


@pytest.fixture
def patch_set(tmp_path: Path, series: Series) -> Path:
    """A copy of the real patch set folder, for a test to break."""
    folder = tmp_path / series.folder.name
    shutil.copytree(series.folder, folder)
    return folder


def linked_copy(tree: Path, dest: Path) -> Path:
    """dest/python: tree/python's files as hard links (no bytes copied); returns dest.

    Change a file of the copy only through replace_text, which gives the copy a
    file of its own instead of writing through the link into tree.
    """
    shutil.copytree(
        tree / "python",
        dest / "python",
        ignore=shutil.ignore_patterns("__pycache__"),
        copy_function=os.link,
    )
    return dest


def replace_text(path: Path, text: str) -> None:
    """Write text to path as a new file (path may be a hard link into another tree)."""
    path.unlink()
    path.write_text(text)


def repin(folder: Path) -> None:
    """Write the current sha256 of every patch in folder into its pin.toml.

    The [build-wheel] series hash follows, so that a test sees only the
    problem it made.
    """
    pin = folder / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    for patch in folder.glob("*.patch"):
        text = re.sub(
            rf'^"{re.escape(patch.name)}" = "[0-9a-f]+"$',
            f'"{patch.name}" = "{sha256_of(patch)}"',
            text,
            flags=re.M,
        )
    pin.write_text(text, encoding="utf-8")
    digest = series_sha256(PinManifest.load(pin))
    text = re.sub(r'^series-sha256 = "[0-9a-f]*"$', f'series-sha256 = "{digest}"', text, flags=re.M)
    pin.write_text(text, encoding="utf-8")


# --- a user's sglang checkout, and what a run may change in it -----------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "--all")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def repo_state(repo: Path) -> dict[str, str]:
    """Everything a run could change in a checkout: refs, HEAD, status, worktrees."""
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git(repo, "symbolic-ref", "-q", "HEAD") + " " + git(repo, "rev-parse", "HEAD"),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


def blobs(repo: Path, rev: str, series: Series) -> dict[str, str]:
    """path -> blob id at rev of every file the series touches (one git call)."""
    files = series.manifest.files
    ids = git(repo, "rev-parse", *(f"{rev}:{path}" for path in files)).splitlines()
    return dict(zip(files, ids, strict=True))


def slim_checkout_of(wheel_file: Path, files: list[str], repo: Path, message: str) -> Path:
    """A user's checkout holding only the given files, as the wheel has them.

    The commands read and patch only the files a series touches, so a run on
    this goes through the same steps as on sglang's whole tree, at a fraction
    of the cost (the whole tree is covered by the `full_checkout` fixture's tests).
    """
    for path, data in wheel.read_files(wheel_file, files).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    git(repo, "init", "-q", "--initial-branch=main")
    commit_all(repo, message)
    return repo


def slim_patch_set(series: Series, wheel_cache: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of series' patch set whose pinned wheel holds only the touched files.

    Returns (patch set folder, wheel cache holding the slim wheel). With
    `--patch-set` and SGLANG_BACKPORTS_CACHE set to these, apply-patches lays
    out and patches a three-file build tree through the same git calls as the
    real one (the real layout is covered by test_apply_patches).
    """
    manifest = series.manifest
    cache = folder / "cache"
    cache.mkdir(parents=True)
    slim = cache / manifest.base.wheel
    with zipfile.ZipFile(slim, "w") as archive:  # the same bytes every time
        files = wheel.read_files(wheel_cache / manifest.base.wheel, manifest.files)
        for path, data in files.items():
            member = zipfile.ZipInfo(path.removeprefix(wheel.REPO_PREFIX), (2026, 1, 1, 0, 0, 0))
            archive.writestr(member, data)
    patch_set = folder / series.folder.name
    shutil.copytree(series.folder, patch_set)
    pin = patch_set / "pin.toml"
    pin.write_text(
        pin.read_text(encoding="utf-8").replace(manifest.base.sha256, sha256_of(slim)),
        encoding="utf-8",
    )
    return patch_set, cache


def _template(repo: Path) -> Path:
    """Make repo look like a user's: a README beside python/, the release tag."""
    (repo / "README.md").write_text("sglang\n")
    commit_all(repo, "README")
    git(repo, "tag", "v0.5.15.post1")
    return repo


@pytest.fixture(scope="session")
def sglang_template(tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path):
    """A git checkout of sglang 0.5.15.post1's whole python/sglang tree, as a user has one."""
    repo = tmp_path_factory.mktemp("template") / "sglang"
    wheel.extract_package(wheel_cache / series.manifest.base.wheel, repo)
    git(repo, "init", "-q", "--initial-branch=main")
    commit_all(repo, "v0.5.15.post1")
    return _template(repo)


@pytest.fixture(scope="session")
def slim_template(tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path):
    """The same release, holding only the files the series touches (see slim_checkout_of)."""
    repo = tmp_path_factory.mktemp("slim-template") / "sglang"
    wheel_file = wheel_cache / series.manifest.base.wheel
    return _template(slim_checkout_of(wheel_file, series.manifest.files, repo, "v0.5.15.post1"))


def _clone(template: Path, repo: Path) -> Path:
    """A fresh clone of a template, with the user's identity and an untracked file."""
    subprocess.run(["git", "clone", "-q", str(template), str(repo)], check=True)
    git(repo, "config", "user.name", "User")
    git(repo, "config", "user.email", "user@example.com")
    (repo / "notes.txt").write_text("my notes\n")
    return repo


@pytest.fixture
def checkout(tmp_path: Path, slim_template: Path) -> Path:
    """A user's checkout of 0.5.15.post1's touched files (most tests: cheap to remake)."""
    return _clone(slim_template, tmp_path / "sglang")


@pytest.fixture
def full_checkout(tmp_path: Path, sglang_template: Path) -> Path:
    """A user's checkout of 0.5.15.post1's whole tree."""
    return _clone(sglang_template, tmp_path / "sglang")
