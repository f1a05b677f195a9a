"""The README's claims that code can check: its exit-code table, its layout, its import rule."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import exit_codes as docs
from conftest import SCRIPTS
from patchset.errors import Exit

ROOT = SCRIPTS.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The README's import rule: each library may import only these of ours; ci/
# sits above them all, beside the commands.
ALLOWED = {
    "patchset": set(),
    "checkinstall": {"patchset"},
    "treefork": {"patchset"},
    "patchreview": {"patchset"},
    "racecheck": {"patchset", "treefork"},
    "testrun": {"patchset", "treefork"},
}
CI_MAY_IMPORT = {"patchset", "testrun", "commands", "gpustage", "exit_codes"}
OURS = {*ALLOWED, "commands", "launch", "gpustage", "exit_codes", "bench_wait_stream"}


def test_the_exit_code_table_is_the_enums():
    assert docs.with_table(README) == README, "stale: run `python3 ci/exit_codes.py --write`"
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


DYNAMIC = {"import_module", "run_module", "__import__"}


def imports_of(path: Path) -> set[str]:
    """The top-level names of ours that a file imports: statically, or at run time
    through importlib.import_module, runpy.run_module, runpy.run_path or __import__
    with a literal name (a path's first folder under scripts/ or ci/ counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            target = _literal_prefix(node.args[0])
            if name in DYNAMIC and target:
                found.add(target.split(".")[0])
            elif name == "run_path" and target:
                found.add(Path(target).parts[0] if "/" in target else target)
    return found & (OURS | {"ci", "scripts"})


def _literal_prefix(node: ast.expr) -> str:
    """The constant start of a string argument: 'a.b', or f'commands.{x}' and
    'commands.' + x -> 'commands.'."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_prefix(node.left)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return ""


def ci_files() -> list[Path]:
    ci = ROOT / "ci"
    return sorted([*ci.rglob("*.py"), ci / "run-gpu"])


def test_the_libraries_import_one_way():
    for library, allowed in ALLOWED.items():
        where = SCRIPTS / library
        files = sorted(where.rglob("*.py")) if where.is_dir() else [SCRIPTS / f"{library}.py"]
        assert files, library
        for path in files:
            wrong = imports_of(path) - allowed - {library}
            assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_ci_imports_only_what_the_rule_allows():
    for path in ci_files():
        wrong = imports_of(path) - CI_MAY_IMPORT - {"ci", "scripts"}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_the_import_rule_sees_imports_made_at_run_time(tmp_path: Path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import importlib, runpy\n"
        "importlib.import_module(f'commands.{name}')\n"
        "runpy.run_module('racecheck.cli')\n"
        "__import__('testrun')\n"
        "importlib.import_module('patchset.' + name)\n"
    )
    assert imports_of(sample) == {"commands", "racecheck", "testrun", "patchset"}
