"""check-install on files no blob id names: judged by their code shape (patchset/shape.py).

Each fork is a copy of a step tree of the session's build folder (real sglang
0.5.15.post1) with a line changed, so its blob ids match nothing the catalog knows.
The verdict says it was judged by shape, the exit code is the one a release with
that judgement gets, and a configuration is judged on the judged shape, never
"not exposed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from check_install_json import validate
from command_server import check_install
from conftest import SCRIPTS, SESSION_TREES, linked_copy, replace_text
from patchset import shape
from patchset.errors import Exit

pytestmark = SESSION_TREES

JUDGED = "judged by code shape, not a known release"
DECODE = Path(shape.DECODE)
WAIT = "            self.schedule_stream.wait_stream(self.forward_stream)\n"


def fork(tree: Path, folder: Path, old: str = "", new: str = "") -> Path:
    """A copy of tree with a comment added to decode.py, and old (found once) made new."""
    linked_copy(tree, folder)
    source = (folder / DECODE).read_text()
    if old:
        assert source.count(old) == 1, f"{old!r} is not once in decode.py"
        source = source.replace(old, new)
    replace_text(folder / DECODE, source + "# a fork's own line\n")
    return folder


def check(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = check_install("--tree", str(tree), *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("verdict: "))


@pytest.mark.parametrize(
    ("step", "code", "word"),
    [("base", Exit.AFFECTED, "affected"), ("0001", Exit.PARTIAL_FIX, "partial fix")],
)
def test_an_unfixed_fork_is_named_exposed_by_shape(
    session_step_trees: dict[str, Path], tmp_path: Path, step: str, code: Exit, word: str
) -> None:
    result = check(fork(session_step_trees[step], tmp_path / "fork"))
    assert result.returncode == code, result.stdout + result.stderr
    assert verdict(result).startswith(f"verdict: {word}: {JUDGED}: "), result.stdout
    assert "get_new_prebuilt_batch reaches process_prebuilt()" in result.stdout
    obj = json.loads(check(tmp_path / "fork", "--format", "json").stdout)
    validate(obj)
    assert obj["exit_code"] == code
    assert obj["verdict"]["basis"] == "code shape"
    assert obj["verdict"]["shape"]["verdict"] == (
        shape.AFFECTED if step == "base" else shape.FIX_A_ONLY
    )
    # races as in known content with the same fixes: 0.5.15.post1's own base, or for
    # fix A a release that carries it as shipped and shares its overlap_utils.py
    assert obj["verdict"]["shape"]["races_as_in"].startswith("unpatched sglang 0.5.1")
    assert obj["races_open"], obj


def test_a_fork_with_the_fix_is_fixed_by_shape_whatever_the_configuration(
    patched_tree: Path, tmp_path: Path
) -> None:
    tree = fork(patched_tree, tmp_path / "fork")
    result = check(tree)
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert verdict(result).startswith(f"verdict: fixed ({JUDGED}): "), result.stdout
    decode = check(tree, "--launch-args", "--model-path m --disaggregation-mode decode")
    assert decode.returncode == Exit.OK, decode.stdout + decode.stderr
    assert verdict(decode).endswith("; whatever the configuration"), decode.stdout


def test_a_fork_without_the_wait_is_never_fixed(patched_tree: Path, tmp_path: Path) -> None:
    result = check(fork(patched_tree, tmp_path / "fork", WAIT, "            pass\n"))
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
    assert JUDGED in verdict(result)


def test_a_configuration_is_judged_on_the_shape_and_never_called_safe(
    session_step_trees: dict[str, Path], tmp_path: Path
) -> None:
    tree = fork(session_step_trees["base"], tmp_path / "fork")
    decode = check(tree, "--launch-args", "--model-path m --disaggregation-mode decode")
    assert decode.returncode == Exit.EXPOSED, decode.stdout + decode.stderr
    assert verdict(decode).startswith(f"verdict: exposed: affected: {JUDGED}"), decode.stdout
    prefill = check(tree, "--launch-args", "--model-path m --disaggregation-mode prefill")
    assert prefill.returncode == Exit.EXPOSURE_UNKNOWN, prefill.stdout + prefill.stderr
    assert "whether it keeps them out is not known" in verdict(prefill)


def test_a_tree_the_shape_cannot_read_is_unknown(patched_tree: Path, tmp_path: Path) -> None:
    tree = fork(patched_tree, tmp_path / "fork", "def get_new_prebuilt_batch(", "def renamed(")
    result = check(tree, "--launch-args", "--model-path m --disaggregation-mode prefill")
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    plain = check(tree)
    assert plain.returncode == Exit.UNKNOWN_CONTENT, plain.stdout + plain.stderr
    assert f"{JUDGED}: cannot tell: " in verdict(plain)


def test_a_fifo_a_device_or_a_loop_in_the_tree_does_not_hold_the_judgement(
    session_step_trees: dict[str, Path], tmp_path: Path
) -> None:
    """The judgement reads every .py file of the package: a fifo there would block the
    read for ever, a link loop would have no end; both are passed over."""
    tree = fork(session_step_trees["base"], tmp_path / "fork")
    srt = tree / "python" / "sglang" / "srt"
    os.mkfifo(srt / "a_fifo.py")
    (srt / "loop").symlink_to("..")
    (srt / "zero.py").symlink_to("/dev/zero")
    try:
        result = subprocess.run(
            [sys.executable, str(SCRIPTS / "check-install"), "--tree", str(tree)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        result = None
    assert result is not None, "check-install did not end within 60 s"
    assert result.returncode == Exit.AFFECTED, result.stdout + result.stderr
