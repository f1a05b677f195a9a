"""Every FutureMap writer of a tree, found in the source (ast) and classified by data.

A writer is a reference to `future_map.publish` or `future_map.stash` (called,
or handed on as with functools.partial), an assignment into a relay buffer
(`x.output_tokens_buf[i] = ...`), or an in-place tensor method called on one.
The [writers] tables (releases.toml's rows, with a base's pin.toml adding its
own) say, for each (file, function, what), the stream it runs on, the ordering
that covers it, and the scenarios that play it or the reason none does. No
torch and no sglang import: text only.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest

from .catalogue import BY_NAME
from .races import RELAY_BUFFERS

_METHODS = ("publish", "stash")
_IN_PLACE = ("copy_", "fill_", "zero_", "index_copy_", "index_put_", "scatter_", "masked_fill_")


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
    """Every writer names future_map or a relay buffer; only such files are parsed."""
    return "future_map" in text or any(buffer in text for buffer in RELAY_BUFFERS)


def scan(tree: Path) -> list[Writer]:
    """Every FutureMap writer under tree/python/sglang, in file and line order."""
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
        found += [Writer(relative, line, fn, what) for line, fn, what in _writes(module)]
    return found


def _writes(module: ast.Module) -> Iterator[tuple[int, str, str]]:
    for scope, node in _walk(module, ""):
        what = _what(node)
        if what:
            yield node.lineno, scope or "<module>", what


def _walk(node: ast.AST, scope: str) -> Iterator[tuple[str, ast.AST]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = f"{scope}.{child.name}" if scope else child.name
            yield from _walk(child, inner)
        else:
            yield scope, child
            yield from _walk(child, scope)


def _what(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute) and node.attr in _METHODS:
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name == "future_map":
            return node.attr
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        if isinstance(target, ast.Subscript):
            buffer = _buffer(target.value)
            if buffer:
                return f"write {buffer}"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _IN_PLACE
    ):
        buffer = _buffer(node.func.value)
        if buffer:
            return f"write {buffer}"
    return ""


def _buffer(node: ast.expr) -> str:
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in RELAY_BUFFERS:
        return node.attr
    return ""


# A row's scenarios: catalogue names separated by spaces, or this word for the
# in-flight forward that every scenario plays.
EVERY_SCENARIO = "all"


def classification(manifest: PinManifest) -> dict[str, dict[str, str]]:
    """The merged [writers] table (releases.toml's rows and the base's own): key ->
    {stream, order, scenarios | reason}; every scenario it names is one of the catalogue's."""
    if not manifest.writers:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            "neither patches/releases.toml nor the pin manifest has a [writers] row",
            "classify each FutureMap writer in [writers] (docs/maintaining.md)",
        )
    own = manifest.raw.get("writers", {})
    return checked(manifest.writers, lambda key: "pin.toml" if key in own else "releases.toml")


def checked(
    rows: dict[str, dict[str, str]], where: Callable[[str], str]
) -> dict[str, dict[str, str]]:
    """rows, once each scenario they name is known to be one of the catalogue's."""
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


def table_rows(found: list[Writer], classes: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = [["writer", "at", "stream", "ordering that covers it", "scenario / reason"]]
    for writer in found:
        entry = classes.get(writer.key)
        if entry is None:
            rows.append([f"{writer.function} {writer.what}", _at(writer), "UNCLASSIFIED", "", ""])
            continue
        rows.append(
            [
                f"{writer.function} {writer.what}",
                _at(writer),
                entry["stream"],
                entry["order"],
                entry.get("scenarios") or entry["reason"],
            ]
        )
    return rows


def _at(writer: Writer) -> str:
    return f"{writer.file}:{writer.line}"


def main(tree: Path, manifest: PinManifest) -> int:
    print(f"race-check: scanning {tree / 'python' / 'sglang'} for FutureMap writers")
    classes = classification(manifest)
    found = scan(tree)
    for row in table_rows(found, classes):
        print(" | ".join(row))
    unclassified = [w for w in found if w.key not in classes]
    if unclassified:
        print(
            f"FAILED: {len(unclassified)} writer(s) the [writers] table does not classify: "
            + ", ".join(w.key for w in unclassified)
        )
        return Exit.RACE
    print(f"ok: {len(found)} writers, every one classified")
    return Exit.OK
