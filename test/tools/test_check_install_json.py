"""check-install --format json: one object on standard output for every verdict and for a
refusal, with the same exit code as the text output (the venv cases: 24, 27 and a fork,
are in test_check_install_dists.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from check_install_json import validate
from command_server import check_install
from conftest import SESSION_TREES
from patchset.errors import Exit
from patchset.manifest import Series

pytestmark = SESSION_TREES

DECODE = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"
PREFILL = "--model-path m --disaggregation-mode prefill"


def both(*args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    text = check_install(*args)
    result = check_install(*args, "--format", "json")
    assert "Traceback" not in text.stderr + result.stderr
    assert result.stdout.startswith("{") and result.stdout.count("\n}\n") == 1, result.stdout
    obj = json.loads(result.stdout)
    validate(obj)
    assert obj["exit_code"] == result.returncode == text.returncode, text.stdout + text.stderr
    return text, obj


@pytest.fixture
def unknown(tmp_path: Path, series: Series, session_step_trees: dict[str, Path]) -> Path:
    """A tree whose decode.py is base's with its prebuilt entry renamed: content no
    release has, in a shape no judgement can tell."""
    tree = tmp_path / "tree"
    for name in series.manifest.files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(session_step_trees["base"] / name, tree / name)
    decode = tree / series.manifest.files[1]
    text = decode.read_text().replace("def get_new_prebuilt_batch(", "def get_next_batch(")
    decode.write_text(text)
    return tree / "python"


@pytest.mark.parametrize(
    ("step", "args", "code", "races"),
    [
        ("0002", [], Exit.OK, 0),
        ("base", [], Exit.AFFECTED, 13),
        ("0001", [], Exit.PARTIAL_FIX, 12),
        ("base", ["--launch-args", DECODE], Exit.EXPOSED, 13),
        ("base", ["--launch-args", PREFILL], Exit.NOT_EXPOSED, 13),
        ("0002", ["--launch-args", DECODE], Exit.OK, 0),
    ],
)
def test_each_verdict_of_a_known_content(
    session_step_trees: dict[str, Path], step: str, args: list[str], code: Exit, races: int
):
    text, obj = both("--tree", str(session_step_trees[step] / "python"), *args)
    assert obj["exit_code"] == code, text.stdout
    assert obj["verdict"]["basis"] == "blob id" and len(obj["races_open"]) == races
    assert f"verdict: {obj['verdict']['text']}\n" in text.stdout
    assert [f["blob_id"] for f in obj["files"]] == [
        line.split("  blob ")[1].split()[0]
        for line in text.stdout.splitlines()
        if "  blob " in line
    ]
    if args:
        effects = obj["configuration"]["effects"] if code != Exit.OK else []
        assert all(line in text.stdout for line in effects)
        assert (obj["configuration"] is None) == (code == Exit.OK)


def test_unknown_content_without_and_with_a_configuration(unknown: Path):
    _, obj = both("--tree", str(unknown))
    assert obj["exit_code"] == Exit.UNKNOWN_CONTENT and obj["verdict"]["basis"] == "code shape"
    assert obj["verdict"]["shape"]["verdict"] == "cannot tell"
    _, obj = both("--tree", str(unknown), "--launch-args", PREFILL)
    assert obj["exit_code"] == Exit.EXPOSURE_UNKNOWN
    assert obj["configuration"]["settings"]["disaggregation_mode"] == "prefill"


@pytest.mark.parametrize(
    ("args", "code", "problem"),
    [
        (["--tree", "/nonexistent"], Exit.NOT_INSTALLED, "holds no sglang package"),
        (["--python", "/nonexistent/python"], Exit.ENVIRONMENT, "no such file"),
    ],
)
def test_a_refusal_is_an_object_too(args: list[str], code: Exit, problem: str):
    text, obj = both(*args)
    assert obj["exit_code"] == code and problem in obj["error"]["problem"]
    assert obj["error"]["next_step"] and f"error: {obj['error']['problem']}" in text.stderr
