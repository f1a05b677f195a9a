"""check-install finds the distribution that installs sglang by the files it owns, whatever
its name: a fork under another name (sglang-kt installs the sglang package), a fork over
sglang, a dist-info without RECORD, an egg-info's installed-files.txt, and unknown content
with a configuration, which is still judged and never called safe.

The environments are scratch venvs holding the real sglang/__init__.py and the three
files from the session's build trees, with the dist-info or egg-info folder a package
manager would write for them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from check_install_json import validate
from command_server import check_install
from conftest import SESSION_TREES, make_venv
from patchset.errors import Exit
from patchset.manifest import Series

pytestmark = SESSION_TREES

BASE = "0.5.15.post1"
DECODE_EAGLE = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"
PREFILL = "--model-path m --disaggregation-mode prefill"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    result = check_install(*args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def answer(text: subprocess.CompletedProcess[str]) -> dict:
    """The same run's --format json: its object, validated, with the same code and verdict."""
    result = check(*text.args[2:], "--format", "json")
    assert result.stdout.startswith("{"), result.stdout + result.stderr
    obj = json.loads(result.stdout)
    validate(obj)
    assert obj["exit_code"] == result.returncode == text.returncode, result.stdout
    if obj["verdict"] is not None:
        assert f"verdict: {obj['verdict']['text']}\n" in text.stdout
    return obj


def site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def sglang_files(series: Series) -> list[str]:
    """sglang/__init__.py and the three files, as paths under site-packages."""
    return ["sglang/__init__.py", *(f.removeprefix("python/") for f in series.manifest.files)]


def copy_files(site: Path, tree: Path, files: list[str]) -> None:
    for rel in files:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / "python" / rel, site / rel)


def dist_info(site: Path, name: str, version: str, files: list[str], record: bool = True) -> Path:
    """The .dist-info folder pip writes for name; without RECORD as distro packages ship it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("sglang\n")
    if record:
        rows = []
        for rel in files:
            data = (site / rel).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{rel},sha256={digest.decode()},{len(data)}")
        rows += [f"{info.name}/METADATA,,", f"{info.name}/top_level.txt,,", f"{info.name}/RECORD,,"]
        (info / "RECORD").write_text("\n".join(rows) + "\n")
    return info


def edit(site: Path, rel: str) -> None:
    path = site / rel
    path.write_bytes(path.read_bytes() + b"\n# a fork's own line\n")


def rename(site: Path, rel: str) -> None:
    """decode.py with the prebuilt entry renamed: a shape no judgement can tell."""
    path = site / rel
    text = path.read_text().replace("def get_new_prebuilt_batch(", "def get_next_prebuilt_batch(")
    path.write_text(text)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "venv")


def test_a_fork_under_another_name_is_found_and_named(
    venv: Path, series: Series, session_step_trees: dict[str, Path]
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees["base"], files)
    info = dist_info(site, "sglang-kt", "0.7.2", files)
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert f"distribution: sglang-kt 0.7.2 ({info}; a fork of sglang: not named sglang)" in (
        result.stdout
    )
    assert result.stdout.count("matches RECORD") == 3
    obj = answer(result)
    assert obj["distribution"]["name"] == "sglang-kt" and obj["distribution"]["fork"] is True
    assert [f["record_match"] for f in obj["files"]] == [True] * 3


def test_a_fork_with_its_own_content_still_has_its_configuration_judged(
    venv: Path, series: Series, session_step_trees: dict[str, Path]
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees["base"], files)
    edit(site, files[2])
    dist_info(site, "sglang-kt", "0.7.2", files)
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert "affected: judged by code shape, not a known release" in result.stdout
    result = check("--python", str(venv), "--launch-args", DECODE_EAGLE)
    assert result.returncode == Exit.EXPOSED, result.stdout + result.stderr
    # whatever the configuration, a fork is never "not exposed"
    result = check("--python", str(venv), "--launch-args", PREFILL)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr

    rename(site, files[2])  # now no judgement by shape can tell, nor the version
    result = check("--python", str(venv))
    assert result.returncode == Exit.MODIFIED, result.stdout + result.stderr
    assert "content: cannot tell (judged by code shape" in result.stdout
    result = check("--python", str(venv), "--launch-args", DECODE_EAGLE)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    assert "disaggregation_mode: decode" in result.stdout
    assert "speculative_algorithm: EAGLE" in result.stdout
    assert "no release can be assumed for these files" in result.stdout
    obj = answer(result)
    assert obj["configuration"]["settings"]["disaggregation_mode"] == "decode"
    assert obj["configuration"]["release"] is None and obj["races_open"] is None
    result = check("--python", str(venv), "--launch-args", PREFILL)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr


def test_a_fork_installed_over_sglang_is_two_owners(
    venv: Path, series: Series, session_step_trees: dict[str, Path]
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees["base"], files)
    first = dist_info(site, "sglang", BASE, files)
    edit(site, files[2])  # the fork's install overwrote sglang's file
    second = dist_info(site, "sglang-kt", "0.7.2", files)
    result = check("--python", str(venv))
    assert result.returncode == Exit.AMBIGUOUS, result.stdout + result.stderr
    assert "2 distributions that install the sglang package on its path" in result.stderr
    assert f"sglang {BASE} at {first}" in result.stderr
    assert f"sglang-kt 0.7.2 at {second}" in result.stderr
    obj = answer(result)
    assert obj["error"]["problem"].startswith(str(venv))


@pytest.mark.parametrize(("step", "code"), [("base", Exit.AFFECTED), ("0002", Exit.OK)])
def test_a_dist_info_without_record_is_judged_by_content(
    venv: Path, series: Series, session_step_trees: dict[str, Path], step: str, code: Exit
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees[step], files)
    dist_info(site, "sglang", BASE, files, record=False)
    result = check("--python", str(venv))
    assert result.returncode == code, result.stdout + result.stderr
    assert "it has no RECORD (as distribution and conda packages ship it)" in result.stdout
    assert result.stdout.count("no RECORD: judged by content") == 3
    obj = answer(result)
    assert obj["distribution"]["listing"] is None
    assert [f["record_match"] for f in obj["files"]] == [None] * 3


def test_an_egg_info_is_read_through_its_installed_files(
    venv: Path, series: Series, session_step_trees: dict[str, Path]
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees["base"], files)
    info = site / f"sglang-{BASE}-py3.11.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text(f"Metadata-Version: 1.1\nName: sglang\nVersion: {BASE}\n")
    (info / "installed-files.txt").write_text("".join(f"../{rel}\n" for rel in files))
    result = check("--python", str(venv))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert result.stdout.count("in installed-files.txt (no hash): judged by content") == 3
    obj = answer(result)
    assert obj["distribution"]["listing"] == "installed-files.txt"


def test_an_edited_release_is_judged_as_shipped_and_never_safe(
    venv: Path, series: Series, session_step_trees: dict[str, Path]
):
    site, files = site_packages(venv), sglang_files(series)
    copy_files(site, session_step_trees["base"], files)
    dist_info(site, "sglang", BASE, files)
    rename(site, files[2])  # a shape no judgement can tell: judged as the version says
    result = check("--python", str(venv))
    assert result.returncode == Exit.MODIFIED, result.stdout + result.stderr

    result = check("--python", str(venv), "--launch-args", DECODE_EAGLE)
    assert result.returncode == Exit.EXPOSED, result.stdout + result.stderr
    assert f"judged as sglang {BASE} as shipped" in result.stdout
    obj = answer(result)
    assert obj["configuration"]["release"] == BASE

    result = check("--python", str(venv), "--launch-args", PREFILL)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    assert f"would keep sglang {BASE} as shipped out of the race" in result.stdout


def test_a_tree_of_unknown_content_with_a_configuration_is_exposure_unknown(
    tmp_path: Path, series: Series, session_step_trees: dict[str, Path]
):
    tree = tmp_path / "tree"
    files = [f.removeprefix("python/") for f in series.manifest.files]
    copy_files(tree, session_step_trees["base"], files)
    edit(tree, files[1])
    result = check("--tree", str(tree), "--launch-args", PREFILL)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    assert "disaggregation mode: prefill" in result.stdout
    obj = answer(result)
    assert obj["configuration"]["settings"]["disaggregation_mode"] == "prefill"
