"""scripts/build-wheel for every Python sglang ships: each wheel installed by pip into a
venv of that very Python, and check-install run on it; the manifests' wheel pins."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import SCRIPTS, WHEEL_BUILDS, fetch_or_skip, make_venv, pip
from patched_wheel import (
    assert_only_patched_differ,
    assert_record_right,
    interpreter,
    version_of,
)
from patchset import paths
from patchset.errors import Exit
from patchset.lint import lint_patch_set
from patchset.manifest import PinManifest, Series, patch_set_folders, sha256_of

pytestmark = WHEEL_BUILDS

# The Pythons sglang ships a wheel for (Requires-Python >= 3.10, cp310 to cp313 on the index).
PYTHONS = ("cp310", "cp311", "cp312", "cp313")


def build(
    out: Path, *args: str, cache: Path | None = None, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """scripts/build-wheel --out OUT ARGS, forked from the command server; fresh: in an
    interpreter of its own, for the builds whose bytes are compared (each process has its
    own hash seed, so an order that follows it shows as different bytes)."""
    env = dict(os.environ, SGLANG_BACKPORTS_CACHE=str(cache or paths.cache_dir()))
    command = [str(SCRIPTS / "build-wheel"), "--out", str(out), *args]
    if not fresh:
        return SERVER.run(command[0], command[1:], env=env)
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env)


def wheels_written(result: subprocess.CompletedProcess[str]) -> list[Path]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [Path(p) for p in re.findall(r"^wheel: (.+)$", result.stdout, re.M)]


@pytest.fixture(scope="module")
def originals(series: Series) -> dict[str, Path]:
    """The pinned wheel of each Python, through the hash-checked download (once, cached)."""
    pinned = getattr(series.manifest.release, "wheels", {})
    assert list(pinned) == list(PYTHONS), "the manifest pins a wheel for each Python"
    return {tag: fetch_or_skip(pin, paths.cache_dir()) for tag, pin in pinned.items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, originals: dict[str, Path]) -> dict[str, Path]:
    """build-wheel --all, once: tag -> the patched wheel."""
    return by_tag(wheels_written(build(tmp_path_factory.mktemp("dist"), "--all", fresh=True)))


def by_tag(wheels: list[Path]) -> dict[str, Path]:
    return {re.search(r"-(cp3\d+)-cp3\d+-", w.name)[1]: w for w in wheels}  # type: ignore[index]


@pytest.fixture(scope="module")
def slim_pins(
    tmp_path_factory: pytest.TempPathFactory, series: Series, originals: dict[str, Path]
) -> tuple[Path, Path]:
    """A copy of the patch set whose pinned wheel of each Python holds only the files the
    series touches and the .dist-info folder, each member as the real wheel has it; returns
    (patch set folder, wheel cache). build-wheel makes the same calls on these as on the
    real ones (which the tests above build once), over a few hundred kB instead of 48 MB."""
    folder = tmp_path_factory.mktemp("slim-pins")
    cache = folder / "cache"
    cache.mkdir()
    patch_set = folder / series.folder.name
    shutil.copytree(series.folder, patch_set)
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    kept = {path.removeprefix("python/") for path in series.manifest.files}
    info = f"sglang-{series.manifest.base.version}.dist-info/"
    for tag, wheel_pin in series.manifest.release.wheels.items():
        original, digest = originals[tag], wheel_pin.sha256  # originals: hash-checked
        slim = cache / original.name
        with zipfile.ZipFile(original) as src, zipfile.ZipFile(slim, "w") as dst:
            for member in src.infolist():
                if member.filename in kept or member.filename.startswith(info):
                    copy = zipfile.ZipInfo(member.filename, member.date_time)
                    copy.compress_type = member.compress_type
                    copy.external_attr = member.external_attr
                    dst.writestr(copy, src.read(member))
        assert text.count(digest) == 1, original.name
        text = text.replace(digest, sha256_of(slim))
    pin.write_text(text, encoding="utf-8")
    return patch_set, cache


def test_every_python_sglang_ships_is_built(built: dict[str, Path], series: Series):
    assert list(built) == list(PYTHONS)
    base, local = series.manifest.base.version, series.manifest.local_version
    for tag, wheel in built.items():
        assert wheel.name == f"sglang-{base}+{local}-{tag}-{tag}-manylinux_2_34_x86_64.whl"


@pytest.mark.parametrize("tag", PYTHONS)
def test_only_the_patched_files_metadata_and_record_differ(
    tag: str, built: dict[str, Path], originals: dict[str, Path], series: Series
):
    assert_only_patched_differ(built[tag], originals[tag], series)
    assert_record_right(built[tag])


def test_python_and_python_version_build_the_same_bytes(
    built: dict[str, Path], tmp_path: Path, ours: Path, slim_pins: tuple[Path, Path]
):
    """--python PY takes the tag from that interpreter; each is reproducible (on slim_pins:
    --all's wheel of that Python, built by another process, is the reference)."""
    patch_set, cache = ("--patch-set", str(slim_pins[0])), slim_pins[1]
    every = build(tmp_path / "all", *patch_set, "--all", cache=cache, fresh=True)
    every = by_tag(wheels_written(every))
    assert list(every) == list(PYTHONS)
    python = ("--python", str(interpreter("3.13")))
    (by_interpreter,) = wheels_written(build(tmp_path / "a", *patch_set, *python, cache=cache))
    assert by_interpreter.read_bytes() == every["cp313"].read_bytes()
    version = ("--python-version", "3.10")
    (by_version,) = wheels_written(build(tmp_path / "b", *patch_set, *version, cache=cache))
    assert by_version.read_bytes() == every["cp310"].read_bytes()
    # the default build (the session's own: conftest's ours), of the real wheel
    assert ours.read_bytes() == built["cp311"].read_bytes()


@pytest.mark.parametrize("tag", PYTHONS)
def test_pip_installs_it_into_that_python_and_check_install_says_patched(
    tag: str, built: dict[str, Path], tmp_path: Path, series: Series
):
    version = version_of(tag)
    python = make_venv(tmp_path / "venv", interpreter(version))
    pip(python, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", str(built[tag]))
    # check-install runs on every Python sglang ships for: the venv's own runs it
    command = [str(python), str(SCRIPTS / "check-install")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert f"(Python {version}." in result.stdout.splitlines()[0]
    assert result.stdout.count("matches RECORD") == 3, result.stdout
    base = series.manifest.base.version
    assert re.search(
        rf"^verdict: patched: sglang {re.escape(base)} with the series sglang-{re.escape(base)} ",
        result.stdout,
        re.M,
    ), result.stdout


def test_another_python_s_wheel_is_refused_by_pip(built: dict[str, Path], tmp_path: Path):
    """Why there is a wheel per Python: pip takes only its own interpreter's tag (here a venv
    of the tests' own Python, whose pip bytecode is there, refuses another Python's wheel)."""
    other = next(tag for tag in PYTHONS if tag != f"cp3{sys.version_info[1]}")
    python = make_venv(tmp_path / "venv")
    install = ["--python", str(python), "install", "--no-deps", "--no-index", str(built[other])]
    result = SERVER.run("-m pip", install)  # as conftest's pip, which wants it to succeed
    assert result.returncode != 0
    assert "is not a supported wheel on this platform" in result.stderr


def test_a_python_not_pinned_and_a_python_that_cannot_run(tmp_path: Path, series: Series):
    result = build(tmp_path / "out", "--python-version", "3.9")
    assert result.returncode == Exit.USAGE, result.stderr
    assert (
        f"sglang {series.manifest.base.version} has no wheel for Python 3.9 pinned "
        "(it pins 3.10, 3.11, 3.12, 3.13)"
    ) in result.stderr
    assert build(tmp_path / "out", "--python-version", "3").returncode == Exit.USAGE
    missing = tmp_path / "no-python"
    result = build(tmp_path / "out", "--python", str(missing))
    assert result.returncode == Exit.ENVIRONMENT, result.stderr
    assert f"--python {missing} could not be asked its version" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_pinned_wheel_whose_files_are_not_the_base_is_refused(
    patch_set: Path, tmp_path: Path, series: Series
):
    """Another Python's wheel is patched only if its three files are the [blobs] base."""
    cache = tmp_path / "cache"
    cache.mkdir()
    text = (patch_set / "pin.toml").read_text(encoding="utf-8")
    pin = re.search(r'\ncp312 = \{ wheel = "([^"]+)", sha256 = "([0-9a-f]+)" \}', text)
    assert pin, "the manifest pins a cp312 wheel"
    other = cache / pin[1]
    with zipfile.ZipFile(other, "w") as archive:
        for path in series.manifest.files:
            archive.writestr(path.removeprefix("python/"), f"# not {path}\n")
    (patch_set / "pin.toml").write_text(text.replace(pin[2], sha256_of(other)))
    out = tmp_path / "out"
    result = build(out, "--patch-set", str(patch_set), "--python-version", "3.12", cache=cache)
    assert result.returncode == Exit.BASE_MISMATCH, result.stdout + result.stderr
    assert f"error: the files of {pin[1]} are not the base " in result.stderr
    assert not out.exists() or not any(out.iterdir())


# --- the pins ---------------------------------------------------------------------


def test_every_served_release_pins_every_python():
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        manifest = PinManifest.load(folder / "pin.toml")
        releases = [manifest.release, *manifest.same_files.values()]
        for release in releases:
            assert list(getattr(release, "wheels", {})) == list(PYTHONS), folder
            version = release.wheel.version
            for tag, pin in release.wheels.items():
                assert pin.wheel == f"sglang-{version}-{tag}-{tag}-manylinux_2_34_x86_64.whl"


DAMAGE = {
    # (text to find, replacement): the message, naming the key
    "not a tag": (
        "\ncp312 = {",
        "\npy312 = {",
        'wheels."0.5.15.post1".py312 is not a CPython wheel tag (cp310, cp311, ...)',
    ),
    "the default again": (
        "\ncp312 = {",
        '\ncp311 = { wheel = "x", sha256 = "y" }\ncp312 = {',
        'wheels."0.5.15.post1".cp311 names the Python of sglang.wheel again; remove it',
    ),
    "another Python's file": (
        'cp312 = { wheel = "sglang-0.5.15.post1-cp312-cp312-',
        'cp312 = { wheel = "sglang-0.5.15.post1-cp313-cp313-',
        'wheels."0.5.15.post1".cp312.wheel = '
        '"sglang-0.5.15.post1-cp313-cp313-manylinux_2_34_x86_64.whl" '
        "is not a cp312-cp312-manylinux_2_34_x86_64 wheel",
    ),
    "another release's file": (
        'cp312 = { wheel = "sglang-0.5.15.post1-',
        'cp312 = { wheel = "sglang-0.5.15-',
        'wheels."0.5.15.post1".cp312.wheel = "sglang-0.5.15-cp312-cp312-manylinux_2_34_x86_64.whl" '
        "is not a wheel of sglang 0.5.15.post1",
    ),
    "no sha256": (
        re.compile(r'(cp310 = \{ wheel = "[^"]+"), sha256 = "[0-9a-f]+"'),
        r"\1",
        'wheels."0.5.15.post1".cp310.sha256 is missing',
    ),
    "a bad sha256": (
        re.compile(r'(cp313 = \{ wheel = "[^"]+", sha256 = ")[0-9a-f]+"'),
        r'\1abc"',
        'wheels."0.5.15.post1".cp313.sha256 = "abc" is not a sha256',
    ),
    "a release not served": (
        '[wheels."0.5.15.post1"]',
        '[wheels."0.5.15"]',
        'wheels."0.5.15" names a release this patch set does not serve (it serves 0.5.15.post1)',
    ),
    "not a table": (
        re.compile(r"cp310 = \{[^}]+\}"),
        'cp310 = "sglang-0.5.15.post1-cp310-cp310-manylinux_2_34_x86_64.whl"',
        'wheels."0.5.15.post1".cp310 is a string, not a table',
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_wheel_pin_is_refused_naming_the_key(
    damage: str, patch_set: Path, tmp_path: Path
):
    find, replace, message = DAMAGE[damage]
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    if isinstance(find, re.Pattern):
        damaged = find.sub(replace, text, count=1)
    else:
        damaged = text.replace(find, replace, 1)
    assert damaged != text
    pin.write_text(damaged, encoding="utf-8")
    result = build(tmp_path / "out", "--patch-set", str(patch_set), "--all")
    assert result.returncode == Exit.PATCHSET_INVALID, result.stdout + result.stderr
    assert f"error: {pin}: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    lint = lint_patch_set(patch_set)
    assert any(message in v.message for v in lint.violations), lint.violations


def test_lint_wants_a_wheel_for_every_python(patch_set: Path):
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    pin.write_text(re.sub(r"\ncp313 = \{[^}]+\}", "", text, count=1), encoding="utf-8")
    lint = lint_patch_set(patch_set)
    assert [(v.rule, v.message) for v in lint.violations] == [
        (
            "wheels",
            'sglang 0.5.15.post1 pins no wheel for Python 3.13 ([wheels."0.5.15.post1"] cp313): '
            "add its file name and sha256 as the package index lists them "
            "(https://pypi.org/simple/sglang/)",
        )
    ]
