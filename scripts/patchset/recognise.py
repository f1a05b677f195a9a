"""Which release and step a set of sglang's files holds, by their content; or why none."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from .errors import BackportError, Exit
from .manifest import (
    BASE_STEP,
    PinManifest,
    Series,
    git_blob_id,
    patch_set_folders,
    release_key,
)
from .paths import DEFAULT_BASE


def locate_step(
    manifest: PinManifest,
    blobs: dict[str, str | None],
    read_file: Callable[[str], str | None],
    where: str,
) -> str:
    """Which step of the series the tree is at; refuse a tree that is at none."""
    for step in reversed(manifest.steps):
        if blobs == manifest.blobs_at(step):
            return step
    raise _mismatch(manifest, blobs, read_file, where)


def _mismatch(
    manifest: PinManifest,
    blobs: dict[str, str | None],
    read_file: Callable[[str], str | None],
    where: str,
    headline: str = "",
) -> BackportError:
    version = manifest.base.version
    expected = manifest.blobs_at(BASE_STEP)
    if headline:
        lines = [headline, f"  (compared with sglang {version}:)"]
    else:
        lines = [f"{where} is not sglang {version}, the base this series is pinned to:"]
    for path, blob in blobs.items():
        if blob == expected[path]:
            continue
        if blob is None:
            lines.append(f"  {path}: missing")
            continue
        same_in = [r for r, files in manifest.known_releases.items() if files.get(path) == blob]
        known = f" (as in sglang {', '.join(same_in)})" if same_in else ""
        lines.append(f"  {path}: blob {blob}, expected {expected[path]}{known}")

    looks_like = [r for r, files in manifest.known_releases.items() if files == blobs]
    fixed = manifest.upstream_fixed.version
    has_marker = any(fix_in_function(read_file(path) or "", manifest) for path in blobs)
    if any(release_key(r) >= release_key(fixed) for r in looks_like) or has_marker:
        named = f"sglang {looks_like[-1]}" if looks_like else f"sglang {fixed} or later"
        prs = " and ".join(f"#{pr}" for pr in manifest.upstream_prs.values())
        lines.append(
            f"It looks like {named}, which already contains the fixes"
            + (f" (upstream PRs {prs})." if prs else ".")
        )
        return BackportError(
            Exit.ALREADY_UPSTREAM,
            "\n".join(lines),
            "no patch is needed: the fixes are already upstream",
        )
    if looks_like:
        lines.append(f"It looks like sglang {looks_like[-1]}.")
    else:
        near = nearest_release(manifest, blobs)
        lines.append(
            "It matches no sglang release this series knows"
            + (f"; the nearest is sglang {near}." if near else ".")
        )
    return BackportError(
        Exit.BASE_MISMATCH,
        "\n".join(lines),
        "check out the tag of one of those releases; for another release a patch set "
        "of its own is needed under patches/"
        if headline
        else f"check out tag {manifest.tag} (or use the default, the pinned wheel); "
        "for other releases a patch set of their own is needed under patches/",
    )


def fix_in_function(source: str, manifest: PinManifest) -> bool:
    """Whether fix B's line sits in the function it belongs to (not elsewhere in the file).

    0.5.13's decode event loop has the same wait_stream line for another reason,
    so a plain text search would call an unpatched 0.5.13 fixed.
    """
    marker, name = manifest.fix_marker, manifest.fix_function
    if not marker or not name or name not in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == name
        and marker in (ast.get_source_segment(source, node) or "")
        for node in ast.walk(tree)
    )


def nearest_release(manifest: PinManifest, blobs: dict[str, str | None]) -> str | None:
    """The known release that shares most of these files (the newest on a tie)."""
    scored = [
        (sum(files.get(path) == blob for path, blob in blobs.items()), release_key(r), r)
        for r, files in manifest.known_releases.items()
    ]
    best = max(scored, default=None)
    return best[2] if best and best[0] else None


def identify_series(root: Path, files: dict[str, bytes | None], where: str) -> Series:
    """The series (of every patch set under root) whose steps hold these files.

    A tree at any step of a series is recognised by its blob ids, so a checkout
    of any served release (patched or not) gets that release's series; other
    trees are refused as the default series refuses them, naming the nearest
    release or saying the fixes are already upstream.
    """
    blobs = blobs_of(files)
    every = [Series.load(folder) for folder in patch_set_folders(root)]
    for series in every:
        if series.manifest.files != list(files):
            continue
        if any(blobs == series.manifest.blobs_at(step) for step in series.manifest.steps):
            return series
    served = [release for series in every for release in series.manifest.releases]
    default = Series.load(root / f"sglang-{DEFAULT_BASE}")
    headline = f"{where} holds none of the sglang releases served here ({', '.join(served)}):"
    raise _mismatch(default.manifest, blobs, reader(files), where, headline)


def blobs_of(files: dict[str, bytes | None]) -> dict[str, str | None]:
    return {path: git_blob_id(data) if data is not None else None for path, data in files.items()}


def reader(files: dict[str, bytes | None]) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        data = files.get(path)
        return data.decode("utf-8", "replace") if data is not None else None

    return read
