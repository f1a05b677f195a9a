"""The one catalog: which sglang release, series and step a set of files is, by their
blob ids, with the races each leaves open; from releases.toml and every pin.toml.
Standard library only and Python 3.10-safe: check-install's zipapp carries it."""

import functools
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BackportError, Exit
from .manifest import PinManifest, RaceEntry, Series, git_blob_id, patch_set_folders
from .releases import RELEASES_NAME, load_releases, release_key

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
