"""Every FutureMap writer of a tree, found in the source (ast) and classified by data.

A writer is a reference to `future_map.publish` or `future_map.stash` (called,
or handed on as with functools.partial), an assignment into a relay buffer
(`x.output_tokens_buf[i] = ...`), or an in-place tensor method called on one.
The [writers] table of pin.toml says, for each (file, function, what), the
stream it runs on, the ordering that covers it, and the scenario that plays
it or the reason none does. No torch and no sglang import: text only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest

from .races import RELAY_BUFFERS

_METHODS = ("publish", "stash")
_IN_PLACE = ("copy_", "fill_", "zero_", "index_copy_", "index_put_", "scatter_", "masked_fill_")
_FIELDS = ("stream", "order")


@dataclass(frozen=True)
class Writer:
    file: str  # relative to python/sglang
    line: int
    function: str  # Class.method or function
    what: str  # "stash", "publish", or "write BUFFER"

    @property
    def key(self) -> str:
        return f"{self.file} {self.function} {self.what}"


def scan(tree: Path) -> list[Writer]:
    """Every FutureMap writer under tree/python/sglang, in file and line order."""
    root = tree / "python" / "sglang"
    found: list[Writer] = []
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            # Every writer names future_map or a relay buffer; only such files are parsed.
            if "future_map" not in text and not any(b in text for b in RELAY_BUFFERS):
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


def classification(manifest: PinManifest) -> dict[str, dict[str, str]]:
    """The manifest's [writers] table: key -> {stream, order, scenarios | reason}."""
    return checked(manifest.raw.get("writers"), "the pin manifest")


def checked(table: object, where: str) -> dict[str, dict[str, str]]:
    """A [writers] table (a pin.toml's, or patches/upstream-writers.toml's), entries checked."""
    if not isinstance(table, dict):
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"{where} has no [writers] table",
            "classify each FutureMap writer there, as patches/sglang-0.5.15.post1/pin.toml does",
        )
    checked: dict[str, dict[str, str]] = {}
    for key, entry in table.items():
        if (
            not isinstance(entry, dict)
            or any(not isinstance(entry.get(f), str) for f in _FIELDS)
            or not (entry.get("scenarios") or entry.get("reason"))
        ):
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"[writers] {key!r} needs stream, order, and scenarios or a reason",
                f"complete that entry in {where}",
            )
        checked[key] = {k: str(v) for k, v in entry.items()}
    return checked


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
