"""scripts/race-check end to end, on the build tree's step trees and on a broken copy.

Needs the applied build tree (scripts/run-tests applies it before this suite).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from patchset import buildtree, paths
from patchset.manifest import Series

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# The ordering patch 0002 adds to get_new_prebuilt_batch.
WAIT = "            self.schedule_stream.wait_stream(self.forward_stream)\n"


@pytest.fixture(scope="module")
def patched_tree(series: Series) -> Path:
    tree = paths.build_dir() / "steps" / "0002"
    if not buildtree.build_tree_path(series, paths.build_dir()).is_dir() or not tree.is_dir():
        pytest.skip("no applied build tree with step trees (scripts/run-tests lays them out)")
    return tree


def race_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "race-check"), *args], capture_output=True, text=True
    )


def test_every_step_gives_the_expected_table(patched_tree: Path) -> None:
    result = race_check("--step", "all")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ok: the measured table is the expected one" in out
    assert "base: 7 races" in out and "+0001: 6 races" in out and "+0002: no race" in out
    assert "sglang/srt/disaggregation/decode.py:" in out
    assert "timings:" in out


def test_a_tree_without_the_wait_fails_with_race_reports(
    patched_tree: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(patched_tree / "python", broken / "python")
    decode = broken / "python" / "sglang" / "srt" / "disaggregation" / "decode.py"
    source = decode.read_text()
    assert source.count(WAIT) == 1, "patch 0002's wait_stream is not where this test expects it"
    decode.write_text(source.replace(WAIT, "            pass\n"))

    result = race_check("--tree", str(broken))
    assert result.returncode == 15, result.stdout + result.stderr
    assert "FAILED: 7 race(s) in the patched tree" in result.stdout
    assert "output_tokens_buf row 4: unordered writes" in result.stdout
    assert "write on forward_stream" in result.stdout
    assert "write on schedule_stream" in result.stdout

    result = race_check("--tree", str(patched_tree))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: no race" in result.stdout
