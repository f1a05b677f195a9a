"""scripts/check-install: what an environment's sglang runs, in a real scratch venv and on trees."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from command_server import check_install
from conftest import SESSION_TREES, make_venv, pip
from patchset import catalog as catalogs
from patchset import paths, wheel
from patchset.apply import git_apply, scratch_copy
from patchset.errors import Exit
from patchset.manifest import Series, patch_set_folders, release_key

pytestmark = SESSION_TREES

BASE = "0.5.15.post1"
OURS = f"{BASE}+pdrace.2"
# The race checker's scenarios an unpatched 0.5.15.post1 leaves open, and those
# fix A (#30435) leaves open: all but S2, the consumer race.
OPEN_AT_BASE = "S1, S2, S3, S4, S5, S6, S7, S8, S9, L1, L2, L3, L4"
OPEN_WITH_FIX_A = "S1, S3, S4, S5, S6, S7, S8, S9, L1, L2, L3, L4"
DECODE = "srt/disaggregation/decode.py"


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = check_install(*args, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"^verdict: (.*)$", result.stdout, re.M)
    assert found, result.stdout + result.stderr
    return found[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "venv")


def site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def slim_wheel(full: Path, files: list[str], folder: Path) -> Path:
    """full with only sglang/__init__.py and files left of its sglang package, in folder.

    Every other member (the dist-info, its entry points, tools/) and each kept file's
    RECORD row are the wheel's own, byte for byte: pip installs, upgrades and uninstalls
    it as it does the whole wheel, and check-install compares the files with the hashes
    the wheel shipped, without pip's seconds on the 3,700 other files (the whole wheel
    installed and checked: test_wheels_per_python).
    """
    kept = {"sglang/__init__.py", *(path.removeprefix("python/") for path in files)}

    def left_out(name: str) -> bool:
        return name.startswith("sglang/") and not any(k.startswith(name) for k in kept)

    slim = folder / full.name
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(full) as whole, zipfile.ZipFile(slim, "w") as out:
        for info in whole.infolist():
            if left_out(info.filename):
                continue
            data = whole.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                rows = zip(lines, csv.reader(lines), strict=True)
                data = "".join(line for line, row in rows if not left_out(row[0])).encode()
            out.writestr(info, data)
    return slim


@pytest.fixture(scope="module")
def slim_base(tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path) -> Path:
    """The base release's wheel, slim (see slim_wheel)."""
    full = wheel_cache / series.manifest.base.wheel
    return slim_wheel(full, series.manifest.files, tmp_path_factory.mktemp("slim-base"))


def test_install_upgrade_edit_uninstall_reinstall(
    venv: Path, ours: Path, series: Series, slim_base: Path, tmp_path: Path
):
    original = slim_base
    ours = slim_wheel(ours, series.manifest.files, tmp_path / "ours")
    site = site_packages(venv)

    pip(venv, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", str(original))
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert verdict(result) == f"affected: unpatched sglang {BASE}; races open: {OPEN_AT_BASE}"
    assert result.stdout.count("matches RECORD") == 3

    pip(
        venv,
        "install",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--force-reinstall",
        "--quiet",
        str(ours),
    )
    result = check("--python", str(venv))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"patched: sglang {BASE} with the series sglang-{BASE}")
    assert result.stdout.count("matches RECORD") == 3
    version = subprocess.run(
        [str(venv), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == OURS
    assert sorted(p.name for p in site.glob("sglang*")) == ["sglang", f"sglang-{OURS}.dist-info"]

    # an in-place edit pip does not know of
    decode = site / "sglang" / DECODE
    text = decode.read_bytes()
    decode.write_bytes(text + b"# hot fix\n")
    result = check("--python", str(venv))
    assert result.returncode == Exit.MODIFIED, result.stdout
    assert f"python/sglang/{DECODE}" in result.stdout and "differs from RECORD" in result.stdout
    decode.write_bytes(text)
    assert check("--python", str(venv)).returncode == Exit.OK

    pip(venv, "uninstall", "--yes", "--quiet", "sglang")
    assert list(site.glob("sglang*")) == []
    result = check("--python", str(venv))
    assert result.returncode == Exit.NOT_INSTALLED
    assert "finds no sglang package" in result.stderr

    pip(venv, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", str(original))
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout


def step_tree(root: Path, series: Series, wheel_cache: Path, step: str) -> Path:
    """A folder holding sglang/ with the three files at a step of the series."""
    manifest = series.manifest
    files = wheel.read_files(wheel_cache / manifest.base.wheel, manifest.files)
    upto = manifest.steps.index(step)
    with scratch_copy(dict(files)) as scratch:
        for patch in series.patch_paths[:upto]:
            assert git_apply(scratch, patch).returncode == 0
        for path in manifest.files:
            out = root / path.removeprefix("python/")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes((scratch / path).read_bytes())
    return root


def test_fix_a_only_is_a_partial_fix(tmp_path: Path, series: Series, wheel_cache: Path):
    tree = step_tree(tmp_path, series, wheel_cache, "0001")
    result = check("--tree", str(tree))
    assert result.returncode == Exit.PARTIAL_FIX, result.stdout
    assert verdict(result) == (
        f"partial fix: sglang {BASE} with sglang-{BASE} applied up to patch 0001 "
        f"(has sgl-project/sglang#30435 only); races still open: {OPEN_WITH_FIX_A}"
    )


def test_fixed_upstream(tmp_path: Path, series: Series, upstream_fixed_wheel: Path):
    """0.5.19's own three files (check-install reads no other file of a tree it knows)."""
    with zipfile.ZipFile(upstream_fixed_wheel) as archive:
        for path in series.manifest.files:
            archive.extract(path.removeprefix("python/"), tmp_path)
    result = check("--tree", str(tmp_path))
    assert result.returncode == Exit.OK, result.stdout
    assert verdict(result) == "fixed upstream: sglang 0.5.19; races closed"


def test_unknown_content_and_no_sglang(tmp_path: Path, series: Series, wheel_cache: Path):
    tree = step_tree(tmp_path / "t", series, wheel_cache, series.manifest.final_step)
    assert check("--tree", str(tree)).returncode == Exit.OK
    (tree / "sglang" / DECODE).write_text("# not sglang\n")
    result = check("--tree", str(tree))
    assert result.returncode == Exit.UNKNOWN_CONTENT, result.stdout
    assert "unknown content" in verdict(result)
    empty = check("--tree", str(tmp_path / "nothing-here"))
    assert empty.returncode == Exit.NOT_INSTALLED
    assert "holds no sglang package" in empty.stderr


def test_a_python_that_cannot_be_asked(tmp_path: Path):
    missing = check("--python", str(tmp_path / "no-python"))
    assert missing.returncode == Exit.ENVIRONMENT
    assert "no such file" in missing.stderr


def fake_python(folder: Path, script: str) -> Path:
    """An executable that takes check-install's probe and runs script (sh) instead."""
    fake = folder / "python"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    return fake


def answer(text: str) -> str:
    return f"cat <<'EOF'\n{text}\nEOF"


DIST = '{"version": "0.5.15.post1", "info": null, "direct_url": null, "hooks": []'


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("echo nope >&2\nexit 3", "exit status 3; it said: nope"),
        (
            f"exec {sys.executable} -c 'raise RuntimeError(\"boom\")'",
            "exit status 1; it said: RuntimeError: boom",
        ),
        (answer('{"python": "3.11.7"}') + "\nexit 1", "exit status 1; it said: no output"),
        (answer("[]"), "the answer is an array, not an object; it said: []"),
        (answer("3.11"), "the answer is a number, not an object"),
        (answer("Python 3.11.7"), "its answer is not JSON (Expecting value"),
        (
            "true",
            "its answer is not JSON (Expecting value: line 1 column 1 (char 0)); "
            "it said: no output",
        ),
        (answer('{"python": "3.11.7", "package": null}'), "the answer has no 'dists'"),
        (
            answer('{"python": 3.11, "package": null, "dists": []}'),
            "the answer['python'] is a number, not a string",
        ),
        (
            answer('{"python": "3.11.7", "package": ["/x"], "dists": []}'),
            "the answer['package'] is an array, not a string or null",
        ),
        (
            answer('{"python": "3.11.7", "package": "/x", "dists": "sglang"}'),
            "the answer['dists'] is a string, not an array",
        ),
        (
            answer('{"python": "3.11.7", "package": "/x", "dists": [1]}'),
            "the answer's dists[0] is a number, not an object",
        ),
        (
            answer('{"python": "3.11.7", "package": "/x", "dists": [' + DIST + "}]}"),
            "the answer's dists[0] has no 'files'",
        ),
        (
            answer(
                '{"python": "3.11.7", "package": "/x", "dists": ['
                + DIST
                + ', "files": {"sglang/srt/a.py": "x"}}]}'
            ),
            "the answer's dists[0]['files']['sglang/srt/a.py'] is not [path, hash mode, hash]",
        ),
        (
            answer(
                '{"python": "3.11.7", "package": "/x", "dists": ['
                + DIST.replace('"hooks": []', '"hooks": [null]')
                + ', "files": {}}]}'
            ),
            "the answer's dists[0]['hooks'] holds something that is not a string",
        ),
    ],
)
def test_an_unexpected_answer_from_python_is_exit_16_with_the_reason(
    tmp_path: Path, script: str, reason: str
):
    result = check("--python", str(fake_python(tmp_path, script)))
    assert result.returncode == Exit.ENVIRONMENT, result.stdout + result.stderr
    assert f"is not a python this command can ask ({reason}" in result.stderr, result.stderr
    assert result.stdout == ""


def test_every_known_release_is_named_with_the_races_it_leaves_open():
    catalog = catalogs.load_catalog(paths.PATCHES_ROOT)
    series = Series.load(paths.DEFAULT_PATCH_DIR)
    known = series.manifest.registry.known
    assert len(known) == 13
    for release, entry in known.items():
        matches = catalog.lookup(dict(entry.blobs))
        assert matches, release
        open_ = ", ".join(matches[0].open)
        if release_key(release) >= release_key("0.5.19"):
            assert open_ == "", release
        elif release_key(release) >= release_key("0.5.16"):
            assert open_ == OPEN_WITH_FIX_A, release
        else:
            assert "S1, S2, S3" in open_, release


def test_open_races_per_step_agree_with_the_race_checker_table():
    """On every base and step, check-install's open races are the race table's open cells."""
    from patchset.plays import SCENARIOS
    from racecheck import report

    catalog = catalogs.load_catalog(paths.PATCHES_ROOT)
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        manifest = Series.load(folder).manifest
        expected = report.expected_table(manifest, SCENARIOS)
        for step in manifest.steps:
            measured = tuple(s for s in SCENARIOS if expected[s][step])
            assert catalog.lookup(manifest.blobs_at(step))[0].open == measured, (folder, step)


def test_the_pip_installed_tree_is_patched(installed_tree: Path):
    """What pip installs from our wheel is the patched release (its race-check:
    test_racecheck_command)."""
    result = check("--tree", str(installed_tree))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"patched: sglang {BASE} with the series sglang-{BASE}")


# --- editable installs (PEP 660) and more than one distribution -----------------

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"

[tool.setuptools]
packages = ["sglang"]
"""


def project(root: Path, series: Series, wheel_cache: Path, step: str, src: bool = False) -> Path:
    """A project of sglang's three files at a step, as `pip install -e` takes it:
    flat (setuptools installs a finder module) or src/ (a .pth with the path)."""
    packages = step_tree(root / "src" if src else root, series, wheel_cache, step)
    (packages / "sglang" / "__init__.py").write_text("")
    text = PYPROJECT.format(version=BASE)
    if src:
        text += 'package-dir = {"" = "src"}\n'
    (root / "pyproject.toml").write_text(text)
    return root


def pip_build(python: Path, *args: str) -> None:
    """pip install with a build from source, offline: this environment's setuptools
    builds it (--no-build-isolation), the environment of python gets only the result."""
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    more = ["install", "--no-deps", "--no-index", "--no-build-isolation", "--quiet", *args]
    pip(python, *more, env=env)


@pytest.fixture(scope="module")
def editable(
    tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path
) -> tuple[Path, Path]:
    """(the final step's project, a venv holding it installed editable), made once: each
    test takes a copy of the venv (setuptools' build of it takes seconds)."""
    root = tmp_path_factory.mktemp("editable")
    tree = project(root / "proj", series, wheel_cache, series.manifest.final_step)
    pip_build(make_venv(root / "venv"), "-e", str(tree))
    return tree, root / "venv"


def venv_copy(venv: Path, folder: Path) -> Path:
    """A copy of venv at folder (its python a link to the same interpreter); its python."""
    shutil.copytree(venv, folder, symlinks=True)
    return folder / "bin" / "python"


def test_an_editable_install_of_the_patched_tree_is_patched(
    tmp_path: Path, series: Series, wheel_cache: Path, editable: tuple[Path, Path]
):
    tree = editable[0]
    python = venv_copy(editable[1], tmp_path / "venv")
    site = site_packages(python)
    info = site / f"sglang-{BASE}.dist-info"
    assert json.loads((info / "direct_url.json").read_text())["dir_info"] == {"editable": True}
    (finder,) = site.glob("__editable___sglang_*_finder.py")

    result = check("--python", str(python))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"patched: sglang {BASE} with the series sglang-{BASE}")
    assert result.stdout.count("editable: not in RECORD") == 3, result.stdout
    assert (
        f"distribution: sglang {BASE} ({info}), an editable install of {tree.as_uri()} "
        f"(its hooks put sglang at {tree / 'sglang'}: judged by the files there)"
    ) in result.stdout

    # an edit of an editable tree is new content, not a RECORD mismatch: judged by shape
    decode = tree / "sglang" / DECODE
    text = decode.read_bytes()
    decode.write_bytes(text + b"# hot fix\n")
    result = check("--python", str(python))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith("fixed (judged by code shape, not a known release)")
    decode.write_bytes(text)

    # another copy ahead on sys.path shadows the editable tree: judged as what is found
    shadow = step_tree(tmp_path / "shadow", series, wheel_cache, series.manifest.steps[0])
    (shadow / "sglang" / "__init__.py").write_text("")
    result = check("--python", str(python), env=dict(os.environ, PYTHONPATH=str(shadow)))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert (
        f"whose hooks put sglang at {tree / 'sglang'}; it does not own the files found"
    ) in result.stdout

    # a hook this command cannot read (another backend's finder): judged by content
    finder.write_text(f"import sys\ndef install():\n    sys.path.append({str(tree)!r})\n")
    result = check("--python", str(python))
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    (pth,) = site.glob("__editable__.sglang-*.pth")
    assert (
        f"; its hooks ({pth.name}, {finder.name}) name no sglang folder this command can read"
    ) in result.stdout


def test_an_editable_install_through_a_pth_path_of_the_base_is_affected(
    tmp_path: Path, series: Series, wheel_cache: Path
):
    tree = project(tmp_path / "proj", series, wheel_cache, series.manifest.steps[0], src=True)
    python = make_venv(tmp_path / "venv")
    pip_build(python, "-e", str(tree))
    (pth,) = site_packages(python).glob("__editable__.sglang-*.pth")
    assert pth.read_text().strip() == str(tree / "src"), "setuptools wrote no path line"

    result = check("--python", str(python))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert verdict(result) == f"affected: unpatched sglang {BASE}; races open: {OPEN_AT_BASE}"
    assert result.stdout.count("editable: not in RECORD") == 3, result.stdout


def test_two_distributions_on_the_path_are_refused_in_either_order(
    tmp_path: Path, slim_base: Path, editable: tuple[Path, Path]
):
    """The editable install, and the base release's wheel installed into another folder."""
    python = venv_copy(editable[1], tmp_path / "venv")
    site = site_packages(python)
    other = tmp_path / "other"
    target = ["--target", str(other), str(slim_base)]
    pip(python, "install", "--no-deps", "--no-index", "--no-compile", "--quiet", *target)
    infos = [site / f"sglang-{BASE}.dist-info", other / f"sglang-{BASE}.dist-info"]
    assert all(info.is_dir() for info in infos)

    (site / "zz-other.pth").write_text(f"{other}\n")  # after site-packages on sys.path
    after = check("--python", str(python))
    (site / "zz-other.pth").unlink()
    before = check("--python", str(python), env=dict(os.environ, PYTHONPATH=str(other)))
    for result, first, second in ((after, *infos), (before, *reversed(infos))):
        assert result.returncode == Exit.AMBIGUOUS, result.stdout + result.stderr
        assert (
            f"has 2 distributions named sglang on its path: sglang {BASE} at {first}; "
            f"sglang {BASE} at {second}."
        ) in result.stderr
        assert f"next step: keep one of them: `{python} -m pip uninstall --yes sglang`" in (
            result.stderr
        )
