"""scripts/lint-patches: the real patch set passes, and each rule catches a break.

Every broken case copies the real patch set to tmp_path, breaks exactly one
thing, re-pins the patch hashes where the break is not about hashes (so that
only the rule under test can fire), and checks the command's exit code and
the FILE:LINE of the report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import repin

ROOT = Path(__file__).resolve().parents[2]
LINT = ROOT / "scripts" / "lint-patches"
REAL = ROOT / "patches" / "sglang-0.5.15.post1"
P1 = "0001-overlap-chain-FutureMap.publish_ready-records-across.patch"
P2 = "0002-disagg-decode-order-prebuilt-seeding-after-the-in-fl.patch"
PATCHSET_INVALID = 6


def started_lint(folder: Path) -> subprocess.CompletedProcess[str]:
    """lint-patches on folder, started as a user starts it."""
    return subprocess.run(
        [sys.executable, str(LINT), "--patch-set", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder.parent,
    )


Lint = Callable[[Path], subprocess.CompletedProcess[str]]


@pytest.fixture
def lint() -> Lint:
    """lint-patches on a folder, each run forked from the command server."""

    def run(folder: Path) -> subprocess.CompletedProcess[str]:
        args = ("--patch-set", str(folder))
        return SERVER.run(LINT, list(args), cwd=folder.parent)

    return run


def rules_of(result: subprocess.CompletedProcess[str]) -> set[str]:
    return set(re.findall(r"^\S+: \[([a-z-]+)\]", result.stdout, re.M))


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, f"{old!r} not in {path.name}; the fixture is out of date"
    path.write_text(text.replace(old, new, count), encoding="utf-8")


def line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def assert_only(result: subprocess.CompletedProcess[str], rule: str) -> None:
    assert result.returncode == PATCHSET_INVALID, result.stdout + result.stderr
    assert rules_of(result) == {rule}, result.stdout
    assert "Traceback" not in result.stderr


def test_real_patch_set_passes() -> None:
    result = started_lint(REAL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lint ok: 2 patches" in result.stdout
    # every rule that looks at content looked at something
    for rule in ("series", "manifest", "allow-list", "description", "trailers", "whitespace"):
        assert re.search(rf"\b{rule} [1-9]", result.stdout), (rule, result.stdout)


def test_series_names_missing_file(patch_set: Path, lint: Lint) -> None:
    (patch_set / P2).unlink()
    result = lint(patch_set)
    assert_only(result, "series")
    assert f"series:{line_of(patch_set / 'series', P2)}: [series] {P2} is listed" in result.stdout


def test_series_lists_a_patch_twice(patch_set: Path, lint: Lint) -> None:
    with (patch_set / "series").open("a", encoding="utf-8") as series:
        series.write(P1 + "\n")
    result = lint(patch_set)
    # listed twice is a series problem; the manifest's order check sees it too
    assert result.returncode == PATCHSET_INVALID
    assert "series:4: [series] " + P1 + " is listed again (first on line 2)" in result.stdout


def test_unlisted_patch_file(patch_set: Path, lint: Lint) -> None:
    shutil.copy(patch_set / P1, patch_set / "0003-stray.patch")
    result = lint(patch_set)
    assert_only(result, "series")
    assert "0003-stray.patch: [series] this patch file is not listed" in result.stdout


def test_patch_outside_allow_list(patch_set: Path, lint: Lint) -> None:
    edit(
        patch_set / P2,
        "python/sglang/srt/disaggregation/decode.py",
        "python/sglang/srt/managers/scheduler.py",
        count=10,
    )
    repin(patch_set)
    result = lint(patch_set)
    assert result.returncode == PATCHSET_INVALID
    line = line_of(patch_set / P2, "diff --git a/python/sglang/srt/managers/scheduler.py")
    assert f"{P2}:{line}: [allow-list] touches python/sglang/srt/managers/scheduler.py" in (
        result.stdout
    )
    # and decode.py, no longer touched, is pinned to change at that step
    assert f"{P2}: [manifest] does not touch python/sglang/srt/disaggregation/decode.py" in (
        result.stdout
    )
    assert rules_of(result) == {"allow-list", "manifest"}


def test_missing_description(patch_set: Path, lint: Lint) -> None:
    path = patch_set / P1
    text = path.read_text(encoding="utf-8")
    start = text.index("With overlap scheduling")
    end = text.index("Upstream-Status:")
    path.write_text(text[:start] + text[end:], encoding="utf-8")
    repin(patch_set)
    result = lint(patch_set)
    assert_only(result, "description")
    assert f"{P1}:4: [description] no description" in result.stdout


def test_missing_trailer(patch_set: Path, lint: Lint) -> None:
    edit(patch_set / P2, "Upstream-PR: sgl-project/sglang#35748\n", "")
    repin(patch_set)
    result = lint(patch_set)
    assert_only(result, "trailers")
    assert f"{P2}:4: [trailers] no Upstream-PR: trailer" in result.stdout


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("Upstream-Status: Backport", "Upstream-Status: Merged", "'Merged' is not one of"),
        ("sgl-project/sglang#30435", "PR 30435", "is not owner/repo#NUMBER"),
        ("Upstream-Release: 0.5.16", "Upstream-Release: soon", "is not a version"),
        ("Upstream-Release: 0.5.16", "Upstream-Release: 0.5.14", "is not newer than"),
        (
            "Upstream-Release: 0.5.16",
            "Upstream-Release: 0.5.17",
            "0.5.17, but releases.toml says fix-a (what step 0001 adds, [step-fixes]) is 0.5.16",
        ),
        (
            "sgl-project/sglang#30435",
            "sgl-project/sglang#30436",
            "#30436, but releases.toml says fix-a (what step 0001 adds, [step-fixes]) is "
            "sgl-project/sglang#30435",
        ),
    ],
)
def test_bad_trailer_value(patch_set: Path, old: str, new: str, message: str, lint: Lint) -> None:
    edit(patch_set / P1, old, new)
    repin(patch_set)
    result = lint(patch_set)
    assert_only(result, "trailers")
    line = line_of(patch_set / P1, new)
    where = re.escape(f"{patch_set.name}/{P1}:{line}")
    assert re.search(rf"^{where}: \[trailers\] .*{re.escape(message)}", result.stdout, re.M)


def test_trailing_whitespace_on_added_line(patch_set: Path, lint: Lint) -> None:
    edit(
        patch_set / P2, "+        if self.enable_overlap:\n", "+        if self.enable_overlap: \n"
    )
    repin(patch_set)
    result = lint(patch_set)
    assert_only(result, "whitespace")
    line = line_of(patch_set / P2, "+        if self.enable_overlap: ")
    assert (
        f"{P2}:{line}: [whitespace] added line python/sglang/srt/disaggregation/decode.py:1976"
        in result.stdout
    )


def test_trailing_whitespace_on_context_line_is_fine(patch_set: Path, lint: Lint) -> None:
    # only added lines are ours to fix; the rule must not fire on context
    edit(patch_set / P2, "\n         return new_batch\n", "\n         return new_batch \n")
    repin(patch_set)
    result = lint(patch_set)
    assert "[whitespace]" not in result.stdout


def test_patch_file_without_final_newline(patch_set: Path, lint: Lint) -> None:
    path = patch_set / P1
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    repin(patch_set)
    result = lint(patch_set)
    assert_only(result, "final-newline")
    assert f"{P1}:" in result.stdout and "no newline at the end of the file" in result.stdout


def test_patched_file_would_lack_final_newline(patch_set: Path, lint: Lint) -> None:
    edit(
        patch_set / P2,
        "+            self.schedule_stream.wait_stream(self.forward_stream)\n",
        "+            self.schedule_stream.wait_stream(self.forward_stream)\n"
        "\\ No newline at end of file\n",
    )
    repin(patch_set)
    result = lint(patch_set)
    assert "[final-newline]" in result.stdout
    assert "decode.py would end without a newline" in result.stdout


def test_manifest_hash_mismatch(patch_set: Path, lint: Lint) -> None:
    edit(patch_set / P1, "A CUDA event only remembers", "A CUDA event remembers only")
    result = lint(patch_set)
    assert_only(result, "manifest")
    assert f"{P1}: [manifest] sha256 is " in result.stdout


def test_manifest_blob_mismatch(patch_set: Path, lint: Lint) -> None:
    edit(
        patch_set / "pin.toml",
        '"0002" = "390495b8d4916143dade4d8a4e41748d8d77a6c7"',
        '"0002" = "0000000000000000000000000000000000000000"',
    )
    result = lint(patch_set)
    assert_only(result, "manifest")
    line = line_of(patch_set / P2, "index 2164cade")
    assert (
        f"{P2}:{line}: [manifest] python/sglang/srt/disaggregation/decode.py: post-image"
        in result.stdout
    )


def test_manifest_unreadable(patch_set: Path, lint: Lint) -> None:
    (patch_set / "pin.toml").write_text("[sglang\n", encoding="utf-8")
    result = lint(patch_set)
    assert result.returncode == PATCHSET_INVALID
    assert "pin.toml: [manifest] pin manifest" in result.stdout
    assert "not valid TOML" in result.stdout
    # the rules that need no manifest still ran
    assert "lint ok" not in result.stdout


def test_empty_series_checks_nothing_and_fails(patch_set: Path, lint: Lint) -> None:
    for patch in patch_set.glob("*.patch"):
        patch.unlink()
    (patch_set / "series").write_text("# nothing here\n", encoding="utf-8")
    result = lint(patch_set)
    assert result.returncode == PATCHSET_INVALID
    assert "[nothing-checked]" in result.stdout


def test_missing_folder_is_a_clear_error(tmp_path: Path, lint: Lint) -> None:
    result = lint(tmp_path / "no-such-set")
    assert result.returncode == PATCHSET_INVALID
    assert "does not exist" in result.stderr and "next step:" in result.stderr
    assert "Traceback" not in result.stderr


def test_plain_diff_for_a_fourth_file_is_caught(patch_set: Path, lint: Lint) -> None:
    # No `diff --git` header: git am still applies a plain ---/+++ diff.
    with (patch_set / P2).open("a", encoding="utf-8") as patch:
        patch.write(
            "--- a/python/sglang/srt/managers/scheduler.py\n"
            "+++ b/python/sglang/srt/managers/scheduler.py\n"
            "@@ -1,1 +1,2 @@\n"
            " # Copyright\n"
            "+import os\n"
        )
    repin(patch_set)
    result = lint(patch_set)
    line = line_of(patch_set / P2, "--- a/python/sglang/srt/managers/scheduler.py")
    assert f"{P2}:{line}: [allow-list] touches python/sglang/srt/managers/scheduler.py" in (
        result.stdout
    )
    assert result.returncode == PATCHSET_INVALID
