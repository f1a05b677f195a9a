"""The one catalog: which sglang release, series and step a set of files is, by their blob ids,
with the races each leaves open (from releases.toml and every pin.toml), or the refusal that
says why not. Standard library only and Python 3.10-safe: check-install's zipapp carries it."""

import functools
import shlex
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

from . import paths, shape
from .errors import BackportError, Exit
from .manifest import BASE_STEP, PinManifest, RaceEntry, Series, git_blob_id, patch_set_folders
from .releases import RELEASES_NAME, load_releases, release_key
from .shapeflow import Sources

# the manifests' paths; in a wheel or an install the files sit under sglang/, one folder up
REPO_PREFIX = "python/"


@dataclass(frozen=True)
class KnownContent:
    """One set of the three files this project can name."""

    name: str
    fixes: frozenset[str]  # upstream pull requests whose fix the files carry
    ours: bool  # a step of one of our series, not a release as shipped
    open: tuple[str, ...] = ()  # the scenarios left open ([races] of the manifests)
    release: str = ""  # the release whose [launch] settings apply
    races: tuple[tuple[str, tuple[RaceEntry, ...]], ...] = ()  # by scenario ([] clean)
    series: str = ""  # for a step of one of our series: its folder's name


Blobs = dict[str, str | None]  # repository path -> git blob id (None: missing)
Files = dict[str, bytes | None]  # repository path -> its bytes (None: missing)


def blobs_of(files: Files) -> Blobs:
    return {path: None if data is None else git_blob_id(data) for path, data in files.items()}


def step_in(manifest: PinManifest, blobs: Blobs) -> str | None:
    """Which step of the series the files are at (the last on a tie), or None."""
    return next((s for s in reversed(manifest.steps) if manifest.blobs_at(s) == blobs), None)


@dataclass
class Catalog:
    by_blobs: dict[tuple[tuple[str, str], ...], list[KnownContent]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    releases: dict[str, dict[str, str]] = field(default_factory=dict)  # as shipped, oldest first
    served: dict[str, str] = field(default_factory=dict)  # release -> its series' folder name
    fix_prs: dict[str, str] = field(default_factory=dict)  # "fix-a" -> KnownContent.fixes' name

    def add(self, blobs: dict[str, str], content: KnownContent) -> None:
        entries = self.by_blobs.setdefault(tuple(sorted(blobs.items())), [])
        if content not in entries:
            entries.append(content)

    def lookup(self, blobs: Blobs) -> list[KnownContent]:
        """Everything these blob ids are: steps of our series first, then releases."""
        found = self.by_blobs.get(tuple(sorted(blobs.items())), [])  # type: ignore[arg-type]
        return sorted(found, key=lambda content: not content.ours)

    def prs(self, fixes: frozenset[str]) -> frozenset[str]:
        return frozenset(self.fix_prs[fix] for fix in fixes)

    def like(self, fixes: frozenset[str], release: str | None) -> KnownContent | None:
        """Known content with exactly these fixes, so the races they leave open: release's own
        where it has such content, else the newest release's; as shipped before ours."""
        prs = self.prs(fixes)
        found = [c for entries in self.by_blobs.values() for c in entries if c.fixes == prs]

        def rank(content: KnownContent) -> tuple[object, ...]:
            return (content.release == release, release_key(content.release), not content.ours)

        return max(found, key=rank, default=None)

    def nearest_release(self, blobs: Blobs, among: Container[str] | None = None) -> str | None:
        """The known release (of among) sharing most of these files (newest on a tie), or None."""
        scored = [
            (sum(files.get(path) == blob for path, blob in blobs.items()), release_key(v), v)
            for v, files in self.releases.items()
            if among is None or v in among
        ]
        best = max(scored, default=None)
        return best[2] if best and best[0] else None


@functools.cache
def load_catalog(patches_root: Path) -> Catalog:
    """Each step of each series and each known release, with the races it leaves open (a
    release not served here: those open at any step that holds the same fixes)."""
    folders = patch_set_folders(patches_root)
    if not folders:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"no patch set (a folder with pin.toml) under {patches_root}",
            "run from a copy of the project that has its patches/ folder",
        )
    registry = load_releases(patches_root / RELEASES_NAME)
    all_series = [Series.load(folder, registry) for folder in folders]
    catalog = Catalog(files=list(all_series[0].manifest.files))
    catalog.fix_prs = {name: fix.ref for name, fix in registry.fixes.items()}
    open_with: dict[frozenset[str], tuple[str, ...]] = {}
    races_with: dict[frozenset[str], tuple[tuple[str, tuple[RaceEntry, ...]], ...]] = {}
    for series in all_series:
        manifest = series.manifest
        if not manifest.races:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{series.folder / 'pin.toml'} has no [races] tables, so which races "
                "its steps leave open is not known",
                "write them from a run: scripts/race-check --write-expected",
            )
        served, folder = ", ".join(manifest.releases), series.folder.name
        label = f" +{manifest.local_version}" if manifest.local_version else ""
        names = {
            manifest.final_step: f"sglang {served} with the series {folder} applied{label}",
            manifest.steps[0]: f"unpatched sglang {served}",
        }
        for index, step in enumerate(manifest.steps):
            name = names.get(step, f"sglang {served} with {folder} applied up to patch {step}")
            races = tuple((scenario, by_step[step]) for scenario, by_step in manifest.races.items())
            fixes, left = manifest.step_fixes[step], tuple(s for s, entries in races if entries)
            # a race open at any step with these fixes is open with them
            open_with[fixes] = tuple(dict.fromkeys(open_with.get(fixes, ()) + left))
            races_with.setdefault(fixes, races)
            prs, version = catalog.prs(fixes), manifest.base.version
            content = KnownContent(name, prs, index > 0, left, version, races, folder)
            catalog.add(manifest.blobs_at(step), content)
    # A served release is already named by its series' base step.
    catalog.served = {r: s.folder.name for s in all_series for r in s.manifest.releases}
    catalog.releases = {version: dict(known.blobs) for version, known in registry.known.items()}
    for version, release in registry.known.items():
        if version in catalog.served:
            continue
        if (fixes := release.fixes) not in open_with:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{registry.path}: sglang {version} carries "
                f"{', '.join(sorted(fixes)) or 'no fix'}, and no step of a series "
                "here holds the same fixes, so which races it leaves open is not measured",
                "serve a release with those fixes (docs/maintaining.md), or correct its fixes",
            )
        left, races = open_with[fixes], races_with[fixes]
        content = KnownContent(f"sglang {version}", catalog.prs(fixes), False, left, version, races)
        catalog.add(release.blobs, content)
    return catalog


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
