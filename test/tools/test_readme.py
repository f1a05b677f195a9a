"""The README's claims that code can check: its exit-code table, its layout, its import rule."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from conftest import SCRIPTS
from patchset import docs
from patchset.errors import Exit

ROOT = SCRIPTS.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The README's import rule: each library may import only these of ours.
ALLOWED = {
    "patchset": set(),
    "checkinstall": {"patchset"},
    "treefork": {"patchset"},
    "patchreview": {"patchset"},
    "racecheck": {"patchset", "treefork"},
    "testrun": {"patchset", "treefork"},
}
OURS = {*ALLOWED, "commands", "launch"}


def test_the_exit_code_table_is_the_enums():
    sys.path.insert(0, str(ROOT / "ci"))
    assert docs.with_table(README) == README, (
        "stale: run `PYTHONPATH=scripts python3 -m patchset.docs --write`"
    )
    for code in Exit:
        assert f"\n| {int(code)} | " in README


def test_the_table_check_fails_on_a_stale_table():
    stale = docs.with_table(README).replace("| 130 | ", "| 131 | ")
    assert docs.with_table(stale) != stale


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 250


def tracked() -> list[str]:
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout
    return listing.splitlines()


def test_the_layout_names_every_top_level_entry_and_every_library():
    layout = README.split("## Layout", 1)[1]
    top = {path.split("/", 1)[0] for path in tracked()} - {"README.md"}
    for entry in sorted(top):
        assert f"`{entry}" in layout, entry
    for package in sorted(p.name for p in SCRIPTS.iterdir() if p.is_dir() and p.name[0] != "_"):
        assert f"`{package}/`" in layout or f"`scripts/{package}/`" in layout, package
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"`{doc.name}`" in layout, doc.name
    for named in re.findall(r"`([a-z_-]+\.md)`", layout):
        assert (ROOT / "docs" / named).is_file(), named


def imports_of(path) -> set[str]:
    """The top-level names of ours that a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


def test_the_libraries_import_one_way():
    for library, allowed in ALLOWED.items():
        where = SCRIPTS / library
        files = sorted(where.rglob("*.py")) if where.is_dir() else [SCRIPTS / f"{library}.py"]
        assert files, library
        for path in files:
            wrong = imports_of(path) - allowed - {library}
            assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
