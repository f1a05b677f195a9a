"""Releases we have not seen, judged by their code only: fixed by shape, and every
FutureMap writer classified by a pin.toml or patches/upstream-writers.toml."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchset import paths, shape, wheel
from patchset.errors import BackportError, Exit
from patchset.manifest import (
    Releases,
    Series,
    TomlFile,
    WheelPin,
    patch_set_folders,
    release_key,
    sha256_of,
    writer_rows,
)

from . import writers

UPSTREAM_WRITERS = paths.PATCHES_ROOT / "upstream-writers.toml"
# The wheel every release so far ships for CPython 3.11 on Linux x86_64.
WHEEL_NAME = "sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
# Final releases only: what pip installs without --pre.
_VERSION = re.compile(r"^\d+(\.\d+)*(\.post\d+)?$")


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


def classified() -> writers.Rows:
    table = {}
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        table |= writers.classification(Series.load(folder).manifest)
    ours = TomlFile.load(
        UPSTREAM_WRITERS,
        "writer table",
        "restore it with `git checkout -- patches/upstream-writers.toml`",
        "fix the row the message names (the file's header is the schema)",
    )
    return table | writers.checked(writer_rows(ours), lambda key: str(UPSTREAM_WRITERS))


def judge_wheel(release: str, wheel_file: Path, classes: writers.Rows) -> tuple[bool, list[str]]:
    """Whether the wheel passes, and its verdict's lines: the judgement, each problem."""
    with tempfile.TemporaryDirectory(prefix="watch-releases-") as tmp:
        wheel.extract_package(wheel_file, Path(tmp))
        judged = shape.judge_tree(Path(tmp))
        unclassified = [w for w in writers.scan(Path(tmp)) if w.key not in classes]
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


@contextmanager
def release_wheel(version: str, registry: Releases, cache: Path) -> Iterator[Path]:
    """The pinned wheel (hash-checked, cached) if the registry has one, else a download."""
    known = registry.known.get(version)
    if known is not None and known.wheel is not None:
        yield wheel.fetch_wheel(known.wheel, cache)
        return
    pin = WheelPin(version, WHEEL_NAME.format(version=version), "")
    with wheel.unpinned_wheel(pin, cache) as downloaded:
        yield downloaded
