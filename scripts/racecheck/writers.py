"""Every FutureMap writer of a tree, found by ast (no import), classified by the [writers]
tables; and releases we have not seen, judged by that and their code's shape alone."""

import ast
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from patchset import paths, shape, wheel
from patchset.errors import BackportError, Exit
from patchset.manifest import (
    PinManifest,
    Releases,
    Series,
    TomlFile,
    WheelPin,
    patch_set_folders,
    release_key,
    sha256_of,
    writer_rows,
)
from patchset.plays import BY_NAME
from patchset.shapeflow import MAX_SOURCE_BYTES, PREFIX, Sources

from .report import RELAY_BUFFERS

_IN_PLACE = ("copy_", "fill_", "zero_", "index_copy_", "index_put_", "scatter_", "masked_fill_")
EVERY_SCENARIO = "all"  # as a row's scenarios: the forward every scenario plays
Rows = dict[str, dict[str, str]]  # writer key -> {stream, order, scenarios | reason}
UPSTREAM_WRITERS = paths.PATCHES_ROOT / "upstream-writers.toml"
# The wheel every release so far ships for CPython 3.11 on Linux x86_64.
WHEEL_NAME = "sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
# Final releases only: what pip installs without --pre.
_VERSION = re.compile(r"^\d+(\.\d+)*(\.post\d+)?$")


class Writer(NamedTuple):
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
    files = sorted(root.rglob("*.py"))
    return scan_files((p.relative_to(root).as_posix(), p.read_bytes()) for p in files)


def scan_files(files: Iterable[tuple[str, bytes]]) -> list[Writer]:
    """files: (path under python/sglang/, its bytes), in scan order."""
    found: list[Writer] = []
    for relative, data in files:
        try:
            text = data.decode("utf-8")
            if not may_hold_writers(text):
                continue
            module = ast.parse(text, filename=relative)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # not code this scan can read; sglang ships none such
        found += [Writer(relative, line, fn, what) for line, fn, what in _writes(module, "")]
    return found


def _writes(node: ast.AST, scope: str) -> Iterator[tuple[int, str, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from _writes(child, f"{scope}.{child.name}" if scope else child.name)
            continue
        if what := _what(child):
            yield child.lineno, scope or "<module>", what
        yield from _writes(child, scope)


def _what(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute) and node.attr in ("publish", "stash"):
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
                f"{where(key)} [writers] {key!r}: scenarios = {named!r} names {', '.join(unknown)}"
                ", which is not a scenario of scripts/patchset/plays.py",
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


def newer_releases(registry: Releases) -> list[str]:
    """sglang's final releases on the package index newer than the registry's newest."""
    command = [sys.executable, "-m", "pip", "index", "versions", "sglang"]
    command += ["--disable-pip-version-check", "--only-binary=:all:"]
    result = subprocess.run(command, capture_output=True, text=True)
    listed = re.search(r"^Available versions: (.+)$", result.stdout, re.M)
    if result.returncode != 0 or not listed:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackportError(
            Exit.WHEEL_UNAVAILABLE,
            f"could not list sglang's releases with pip ({' '.join(command[1:])}): {detail}",
            "connect to the package index (or set pip's index options), or name the "
            "releases with --release",
        )
    newest = max(release_key(v) for v in registry.known)
    versions = {v.strip() for v in listed[1].split(",")}
    newer = [v for v in versions if _VERSION.match(v) and release_key(v) > newest]
    return sorted(newer, key=release_key)


def classified() -> Rows:
    table = {}
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        table |= classification(Series.load(folder).manifest)
    ours = TomlFile.load(
        UPSTREAM_WRITERS,
        "writer table",
        "restore it with `git checkout -- patches/upstream-writers.toml`",
        "fix the row the message names (the file's header is the schema)",
    )
    return table | checked(writer_rows(ours), lambda key: str(UPSTREAM_WRITERS))


def judge_wheel(release: str, wheel_file: Path, classes: Rows) -> tuple[bool, list[str]]:
    """Whether the wheel passes, and its verdict's lines: the judgement, each problem."""
    sources = wheel_sources(wheel_file)
    judged = shape.judge(Sources.from_texts({PREFIX + n: data for n, data in sources.items()}))
    unclassified = [w for w in scan_files(sources.items()) if w.key not in classes]
    lines = [f"sglang {release}: {wheel_file.name} sha256 {sha256_of(wheel_file)}"]
    lines += [f"  {line}" for line in judged.lines()]
    if not judged.fixed:
        lines.append(f"  FAILED: judged {judged.verdict}: {judged.reason}")
    lines += [
        f"  FAILED: FutureMap writer {w.function} ({w.what}) at {w.file}:{w.line} is "
        f"classified by no manifest (key {w.key!r})"
        for w in unclassified
    ]
    passed = judged.fixed and not unclassified
    if passed:
        lines.append("  ok: judged fixed, every FutureMap writer classified")
    return passed, lines


def wheel_sources(wheel_file: Path) -> dict[str, bytes]:
    """sglang/'s .py files by path under python/sglang/, in scan()'s order, read in memory
    (5,000 files written out took seconds); as on disk, one over MAX_SOURCE_BYTES is absent."""
    found: dict[PurePosixPath, bytes] = {}
    with zipfile.ZipFile(wheel_file) as archive:
        for member in archive.infolist():
            name = PurePosixPath(*[p for p in member.filename.split("/") if p != ".."])
            if name.parts[:1] != ("sglang",) or name.suffix != ".py" or member.is_dir():
                continue
            if member.file_size <= MAX_SOURCE_BYTES:
                found[name.relative_to("sglang")] = archive.read(member)
    return {name.as_posix(): found[name] for name in sorted(found)}


@contextmanager
def release_wheel(version: str, registry: Releases) -> Iterator[Path]:
    """The pinned wheel (hash-checked, cached) if the registry has one, else a download."""
    known, cache = registry.known.get(version), paths.cache_dir()
    if known is not None and known.wheel is not None:
        yield wheel.fetch_wheel(known.wheel, cache)
        return
    pin = WheelPin(version, WHEEL_NAME.format(version=version), "")
    with wheel.unpinned_wheel(pin, cache) as downloaded:
        yield downloaded
