"""Every FutureMap writer of a tree (publish/stash, or a write into a relay buffer), found
by ast (no import) and classified by the [writers] tables."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest

from .catalogue import BY_NAME
from .report import RELAY_BUFFERS

_METHODS = ("publish", "stash")
_IN_PLACE = ("copy_", "fill_", "zero_", "index_copy_", "index_put_", "scatter_", "masked_fill_")
# A row's scenarios: catalogue names, or this word for the forward every scenario plays.
EVERY_SCENARIO = "all"
Rows = dict[str, dict[str, str]]  # writer key -> {stream, order, scenarios | reason}


@dataclass(frozen=True)
class Writer:
    file: str  # relative to python/sglang
    line: int
    function: str  # Class.method or function
    what: str  # "stash", "publish", or "write BUFFER"

    @property
    def key(self) -> str:
        return f"{self.file} {self.function} {self.what}"


def may_hold_writers(text: str) -> bool:
    return "future_map" in text or any(buffer in text for buffer in RELAY_BUFFERS)


def scan(tree: Path) -> list[Writer]:
    root = tree / "python" / "sglang"
    found: list[Writer] = []
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            if not may_hold_writers(text):
                continue
            module = ast.parse(text, filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # not code this scan can read; sglang ships none such
        relative = path.relative_to(root).as_posix()
        found += [Writer(relative, line, fn, what) for line, fn, what in _writes(module, "")]
    return found


def _writes(node: ast.AST, scope: str) -> Iterator[tuple[int, str, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from _writes(child, f"{scope}.{child.name}" if scope else child.name)
            continue
        what = _what(child)
        if what:
            yield child.lineno, scope or "<module>", what
        yield from _writes(child, scope)


def _what(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute) and node.attr in _METHODS:
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return node.attr if name == "future_map" else ""
    targets = []  # what is written into: a subscript's value, an in-place method's owner
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        assigned = node.targets if isinstance(node, ast.Assign) else [node.target]
        targets = [t.value for t in assigned if isinstance(t, ast.Subscript)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        targets = [node.func.value] if node.func.attr in _IN_PLACE else []
    for target in targets:
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and target.attr in RELAY_BUFFERS:
            return f"write {target.attr}"
    return ""


def classification(manifest: PinManifest) -> Rows:
    """The merged [writers] table (releases.toml's rows and the base's own), checked."""
    if not manifest.writers:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            "neither patches/releases.toml nor the pin manifest has a [writers] row",
            "classify each FutureMap writer in [writers] (docs/maintaining.md)",
        )
    own = manifest.raw.get("writers", {})
    return checked(manifest.writers, lambda key: "pin.toml" if key in own else "releases.toml")


def checked(rows: Rows, where: Callable[[str], str]) -> Rows:
    for key, entry in rows.items():
        named = entry.get("scenarios", "")
        unknown = [n for n in named.split() if n not in BY_NAME]
        if unknown and named != EVERY_SCENARIO:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{where(key)} [writers] {key!r}: scenarios = {named!r} names "
                f"{', '.join(unknown)}, which is not a scenario of "
                "scripts/racecheck/catalogue.py",
                f"name scenarios from {' '.join(BY_NAME)}, separated by spaces, or write "
                f'"{EVERY_SCENARIO}" for the in-flight forward every scenario plays',
            )
    return rows


def main(tree: Path, manifest: PinManifest) -> int:
    print(f"race-check: scanning {tree / 'python' / 'sglang'} for FutureMap writers")
    classes = classification(manifest)
    found = scan(tree)
    print("writer | at | stream | ordering that covers it | scenario / reason")
    for w in found:
        row = classes.get(w.key, {"stream": "UNCLASSIFIED", "order": "", "reason": ""})
        cells = [row["stream"], row["order"], row.get("scenarios") or row["reason"]]
        print(" | ".join([f"{w.function} {w.what}", f"{w.file}:{w.line}", *cells]))
    if unclassified := [w.key for w in found if w.key not in classes]:
        print(
            f"FAILED: {len(unclassified)} writer(s) the [writers] table does not classify: "
            + ", ".join(unclassified)
        )
        return Exit.RACE
    print(f"ok: {len(found)} writers, every one classified")
    return Exit.OK
