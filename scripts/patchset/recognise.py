"""Which served release and step files are (catalog, shape), or the refusal that says why not."""

import shlex
from pathlib import Path

from . import paths, shape
from .catalog import Files, blobs_of, load_catalog, step_in
from .errors import BackportError, Exit
from .manifest import BASE_STEP, Series, release_key
from .shapeflow import Sources


def full_check(where: str | Path) -> str:
    return shlex.join(["scripts/race-check", "--tree", str(where)])


def reading(series: Series | None) -> Series:
    """The given series, else the default: either names the files every series touches."""
    return series or Series.load(paths.DEFAULT_PATCH_DIR)


def recognise(
    files: Files, where: str, series: Series | None, checkout: bool
) -> tuple[Series, str]:
    """The series (the given one, else the one whose steps hold these files), the files' step."""
    blobs = blobs_of(files)
    if series is not None:
        if step := step_in(series.manifest, blobs):
            return series, step
    else:
        for content in load_catalog(paths.PATCHES_ROOT).lookup(blobs):
            if content.series:
                found = Series.load(paths.PATCHES_ROOT / content.series)
                return found, step_in(found.manifest, blobs) or ""
    raise _refusal(files, where, series, checkout)


def _refusal(files: Files, where: str, series: Series | None, checkout: bool) -> BackportError:
    """ALREADY_UPSTREAM when fixed (by release or shape), else BASE_MISMATCH naming the nearest."""
    catalog = load_catalog(paths.PATCHES_ROOT)
    blobs, manifest = blobs_of(files), reading(series).manifest
    version, expected = manifest.base.version, manifest.blobs_at(BASE_STEP)
    if series is None:
        served = ", ".join(catalog.served)
        lines = [
            f"{where} holds none of the sglang releases served here ({served}):",
            f"  (compared with sglang {version}:)",
        ]
    else:
        lines = [f"{where} is not sglang {version}, the base this series is pinned to:"]
    for path, blob in blobs.items():
        if blob is None:
            lines.append(f"  {path}: missing")
        elif blob != expected.get(path):
            same_in = [v for v, known in catalog.releases.items() if known.get(path) == blob]
            known = f" (as in sglang {', '.join(same_in)})" if same_in else ""
            lines.append(f"  {path}: blob {blob}, expected {expected.get(path)}{known}")

    looks_like = [v for v, known in catalog.releases.items() if known == blobs]
    fixed = manifest.registry.upstream_fixed.version
    prs = " and ".join(f"#{fix.pr}" for fix in manifest.registry.fixes.values())
    if any(release_key(r) >= release_key(fixed) for r in looks_like):
        lines.append(
            f"It looks like sglang {looks_like[-1]}, which already contains the fixes"
            + (f" (upstream PRs {prs})." if prs else ".")
        )
        next_step = "no patch is needed: the fixes are already upstream"
        return BackportError(Exit.ALREADY_UPSTREAM, "\n".join(lines), next_step)
    if looks_like:
        lines.append(f"It looks like sglang {looks_like[-1]}.")
    else:
        judged = shape.judge(Sources.from_texts(files))
        if judged.fixed:
            lines.append(
                f"Judged by its code shape, it already holds the fix, as sglang {fixed} or "
                f"later does: {judged.reason}."
            )
            next_step = f"no patch is needed; for the full check run {full_check(where)}"
            return BackportError(Exit.ALREADY_UPSTREAM, "\n".join(lines), next_step)
        near = catalog.nearest_release(blobs)
        lines.append(
            "It matches no sglang release this series knows"
            + (f"; the nearest is sglang {near}." if near else ".")
        )
    next_step = (
        "check out the tag of one of those releases; for another release a patch set "
        "of its own is needed under patches/"
        if series is None
        else f"check out tag {manifest.release.tag} (or use the default, the pinned wheel); "
        "for other releases a patch set of their own is needed under patches/"
    )
    fork_of = None if looks_like else catalog.nearest_release(blobs, catalog.served)
    if fork_of and checkout:
        command = ["scripts/apply-patches", "--sglang", where, "--3way"]
        next_step += (
            f"; if it is a fork of sglang {fork_of}, `{shlex.join(command)}` applies that "
            "release's series with git's three-way merge and keeps the result only if it is "
            "judged fixed"
        )
    return BackportError(Exit.BASE_MISMATCH, "\n".join(lines), next_step)
