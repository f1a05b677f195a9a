"""What build-wheel and a download write: modes that follow the umask, and no
leftover of a killed run past the next run, nothing but our own marked folders removed.

A build that must run to its end builds the slim release (below) where the test is about
what it writes and removes, not about the wheel's content (test_build_wheel builds the
whole one); a run killed or interrupted while it builds builds the whole wheel, whose
seconds of writing are the window the signal lands in.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SCRIPTS
from patchset import deploy, lock, wheel
from patchset.manifest import Series, sha256_of


@dataclass(frozen=True)
class Release:
    """A patch set to build (--patch-set) and a folder holding its pinned wheel."""

    patch_set: Path
    wheels: Path


@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path) -> Release:
    """The default patch set pinned to a wheel of the real members it patches and of its
    .dist-info (bytes, names and metadata as the real wheel has them): build-wheel and pip
    take the same steps as on the whole wheel, without recompressing 3,700 other files."""
    folder = tmp_path_factory.mktemp("slim")
    base = series.manifest.base
    keep = {path.removeprefix(wheel.REPO_PREFIX) for path in series.manifest.files}
    info = "-".join(base.wheel.split("-", 2)[:2]) + ".dist-info/"
    wheels = folder / "wheels"
    wheels.mkdir()
    source, made = wheel_cache / base.wheel, wheels / base.wheel
    with zipfile.ZipFile(source) as real, zipfile.ZipFile(made, "w") as slim_wheel:
        for member in real.infolist():
            if member.filename in keep or member.filename.startswith(info):
                slim_wheel.writestr(member, real.read(member))
    patch_set = folder / series.folder.name
    shutil.copytree(series.folder, patch_set)
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    assert text.count(base.sha256) == 1
    pin.write_text(text.replace(base.sha256, sha256_of(made)), encoding="utf-8")
    return Release(patch_set, wheels)


def offline_index(tmp_path: Path, series: Series, wheels: Path) -> dict[str, str]:
    """pip's options (as environment) that make a download take the pinned wheel
    from a local folder (wheels): the real download path, without the network."""
    links = tmp_path / "index"
    links.mkdir()
    (links / series.manifest.base.wheel).symlink_to(wheels / series.manifest.base.wheel)
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}


def start_build(
    out: Path,
    cache: Path,
    env: dict[str, str],
    umask: int = 0o022,
    patch_set: Path | None = None,
) -> subprocess.Popen:
    chosen = ["--patch-set", str(patch_set)] if patch_set else []
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "build-wheel"), *chosen, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SGLANG_BACKPORTS_CACHE=str(cache), **env),
        umask=umask,
        start_new_session=True,  # its own process group: a kill takes pip with it
        # SIGINT interrupts it even when this test run was started with SIGINT ignored
        # (in the background of a shell, which a started command would inherit)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def build(
    out: Path, cache: Path, env: dict[str, str], umask: int = 0o022, patch_set: Path | None = None
) -> Path:
    run = start_build(out, cache, env, umask, patch_set)
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stdout + stderr
    assert "Traceback" not in stderr
    return Path(re.search(r"^wheel: (.+)$", stdout, re.M)[1])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("umask", "folder", "file"), [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)]
)
def test_every_file_written_follows_the_umask(
    tmp_path: Path, series: Series, slim: Release, umask: int, folder: int, file: int
):
    cache, out = tmp_path / "cache", tmp_path / "dist"
    index = offline_index(tmp_path, series, slim.wheels)
    built = build(out, cache, index, umask, slim.patch_set)
    downloaded = cache / series.manifest.base.wheel
    assert {p: oct(mode(p)) for p in (cache, out)} == {cache: oct(folder), out: oct(folder)}
    assert {p: oct(mode(p)) for p in (downloaded, built)} == {
        downloaded: oct(file),
        built: oct(file),
    }
    assert sorted(p.name for p in cache.iterdir()) == [downloaded.name]
    assert sorted(p.name for p in out.iterdir()) == [built.name]


def kill_when(run: subprocess.Popen, folder: Path, pattern: str) -> Path:
    """SIGKILL run's process group as soon as folder holds an entry named like pattern;
    returns that entry, which the killed run leaves."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        found = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if found:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            assert run.returncode == -signal.SIGKILL
            assert found[0].exists()
            return found[0]
        time.sleep(0.002)
    run.communicate()
    pytest.fail(f"the run ended (exit {run.returncode}) before {folder}/{pattern} appeared")


def look_alikes(folder: Path, prefix: str, suffix: str = "") -> list[Path]:
    """Things named like our temporary folders that are not a killed run's: each must
    survive the next run."""
    text = lock.TEMP_MARKER_TEXT
    names = iter(f"{prefix}{n:016x}{suffix}" for n in range(1, 100))
    plain = folder / next(names)
    plain.write_text("a user's file\n")
    made = [plain]
    markers = {
        lock.TEMP_MARKER: [None, b"my notes\n", text + b"x"],
        f"{lock.TEMP_MARKER}.new": [text],  # beside a file of the user's
    }
    for marker, contents in markers.items():
        for content in contents:
            path = folder / next(names)
            path.mkdir()
            (path / "data").write_text("keep me\n")
            if content is not None:
                (path / marker).write_bytes(content)
            made.append(path)
    # our exact marker: in a folder named otherwise; as a link to a file elsewhere;
    # in a folder elsewhere that a link points at
    other_name = folder / f"{prefix}mine{suffix}"
    other_name.mkdir()
    (other_name / lock.TEMP_MARKER).write_bytes(text)
    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "marker").write_bytes(text)
    linked_marker = folder / next(names)
    linked_marker.mkdir()
    (linked_marker / lock.TEMP_MARKER).symlink_to(elsewhere / "marker")
    (elsewhere / "marked").mkdir()
    (elsewhere / "marked" / lock.TEMP_MARKER).write_bytes(text)
    link = folder / next(names)
    link.symlink_to(elsewhere / "marked")
    return [*made, other_name, linked_marker, link]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_next_build_removes_what_a_killed_build_left(
    tmp_path: Path, wheel_cache: Path, slim: Release
):
    """The killed runs build the whole wheel; the next ones, into the same --out, the slim."""
    out = tmp_path / "dist"
    left = kill_when(start_build(out, wheel_cache, {}), out, ".build-wheel-*")
    built = build(out, slim.wheels, {}, patch_set=slim.patch_set)
    assert listing(out) == [built.name], f"the killed run's {left.name} is still there"

    # only the killed run's marked folder goes: not a look-alike, not a live run's folder
    marker = kill_when(start_build(out, wheel_cache, {}), out, f".build-wheel-*/{lock.TEMP_MARKER}")
    left = marker.parent
    made = look_alikes(out, *deploy.BUILD_TEMP)
    with lock.marked_folder(out, *deploy.BUILD_TEMP) as live:
        build(out, slim.wheels, {}, patch_set=slim.patch_set)
        assert live.is_dir() and (live / lock.TEMP_MARKER).is_file()
    assert not left.exists()
    assert listing(out) == sorted([built.name, *(p.name for p in made)])
    assert sorted(p.name for p in (tmp_path / "elsewhere").rglob("*")) == [
        lock.TEMP_MARKER,
        "marked",
        "marker",
    ]


def test_the_next_download_removes_what_a_killed_download_left(
    tmp_path: Path, series: Series, slim: Release
):
    """Every run downloads the slim wheel: a kill lands while pip runs, as with the whole."""
    index = offline_index(tmp_path, series, slim.wheels)
    cache, out = tmp_path / "cache", tmp_path / "dist"
    chosen = slim.patch_set
    left = kill_when(start_build(out, cache, index, patch_set=chosen), cache, ".download-*")
    build(out, cache, index, patch_set=chosen)
    pinned = series.manifest.base.wheel
    assert listing(cache) == [pinned], f"the killed download's {left.name} is still there"

    (cache / pinned).unlink()
    run = start_build(out, cache, index, patch_set=chosen)
    marker = kill_when(run, cache, f".download-*/{lock.TEMP_MARKER}")
    left = marker.parent
    made = look_alikes(cache, wheel.DOWNLOAD_PREFIX)
    with lock.marked_folder(cache, wheel.DOWNLOAD_PREFIX) as live:
        build(out, cache, index, patch_set=chosen)
        assert live.is_dir() and (live / lock.TEMP_MARKER).is_file()
    assert not left.exists()
    assert listing(cache) == sorted([pinned, *(p.name for p in made)])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_build_removes_its_folder(
    tmp_path: Path, wheel_cache: Path, signum: signal.Signals
):
    out = tmp_path / "dist"
    run = start_build(out, wheel_cache, {})
    deadline = time.monotonic() + 120
    while not list(out.glob(f".build-wheel-*/{lock.TEMP_MARKER}")):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.002)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert f"interrupted ({signum.name}); what this run made was removed" in stderr
    assert listing(out) == []


def test_an_interrupt_as_a_member_is_opened_stays_an_interrupt(
    tmp_path: Path, slim: Release, monkeypatch: pytest.MonkeyPatch
):
    """The narrow window the signal tests above can land in: a SIGTERM as zipfile opens a
    member for writing. It reaches the command as the interrupt (not as zipfile's refusal
    to close an archive with a member open, an internal error; nor as an error printed
    when the archive is dropped), and the folder goes."""
    real, calls, ignored = zipfile._get_compressor, [], []  # type: ignore[attr-defined]

    def compressor(*args: object) -> object:
        calls.append(args)
        if len(calls) == 2:  # to this thread: a command has no other to take it
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        return real(*args)

    def terminate(signum: int, _frame: object) -> None:  # as the commands' handler does
        raise KeyboardInterrupt(signal.Signals(signum).name)

    monkeypatch.setattr(zipfile, "_get_compressor", compressor)
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    out, old = tmp_path / "dist", signal.signal(signal.SIGTERM, terminate)
    try:
        with pytest.raises(BaseException) as raised:
            deploy.build_wheel(Series.load(slim.patch_set), slim.wheels, out, None)
        kind, value = raised.type, repr(raised.value)
        del raised  # its frames hold the archive: dropped here, as at the command's end
        gc.collect()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert kind is KeyboardInterrupt, value
    assert ignored == [], [str(i.exc_value) for i in ignored]
    assert listing(out) == []


def test_a_fifo_named_like_our_marker_is_left_alone(tmp_path: Path):
    """The sweep checks the marker is a plain file before it reads it: a read of a fifo
    would wait forever, and every later run with it."""
    folder = tmp_path / f"{wheel.DOWNLOAD_PREFIX}{'0' * 15}1"
    folder.mkdir()
    os.mkfifo(folder / lock.TEMP_MARKER)
    sweep = "import sys; from pathlib import Path; from patchset import lock, wheel; "
    sweep += "print(lock.remove_leftovers(Path(sys.argv[1]), wheel.DOWNLOAD_PREFIX))"
    try:
        result = subprocess.run(
            [sys.executable, "-c", sweep, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=SCRIPTS,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the sweep read the fifo and waited on it") from None
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    assert stat.S_ISFIFO(os.lstat(folder / lock.TEMP_MARKER).st_mode)
