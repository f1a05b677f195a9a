"""Write the series back out of the patched branch, deterministically."""

import difflib
from pathlib import Path

from .buildtree import build_tree_path, default_branch, files_at, pristine_tag, series_commits
from .catalog import blobs_of
from .errors import BackportError, Exit
from .git import Git
from .lock import marked_folder, tmpdir
from .manifest import MANIFEST_NAME, SERIES_NAME, Series, rewrite_tables, sha256_of, step_of

# `git format-patch` output as a function of the commits alone: no commit ids, full blob
# ids, no version signature, no [PATCH n/m] subject prefix, a fixed diffstat width.
FORMAT_PATCH_FLAGS = [
    "--zero-commit", "--full-index", "--no-signature", "--keep-subject", "--no-numbered",
    "--no-thread", "--no-cover-letter", "--no-attach", "--stat=80", "--no-renames",
    "--abbrev=40", "--src-prefix=a/", "--dst-prefix=b/",
]  # fmt: skip
SERIES_HEADER = (
    "# Applied in this order by scripts/apply-patches; regenerate with scripts/export-patches.\n"
)


def export_to(series: Series, repo: Path, out: Path) -> list[str]:
    manifest = series.manifest
    branch = default_branch(manifest)
    git = Git(repo, owned=True)
    if not repo.is_dir() or git.rev(f"refs/heads/{branch}") is None:
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"{repo} has no branch {branch} to export from",
            "run scripts/apply-patches first",
        )
    # A base that already carries fix A starts at 0002: a step names one fix on every base.
    listing = git.out(
        "format-patch", *FORMAT_PATCH_FLAGS, f"--start-number={manifest.first_number}",
        "-o", str(out), f"{pristine_tag(manifest)}..{branch}",
    )  # fmt: skip
    names = [Path(line).name for line in listing.splitlines() if line.strip()]
    # the base's blob ids are releases.toml's; pin.toml holds each patch's
    blobs: dict[str, dict[str, str]] = {path: {} for path in manifest.files}
    for name, rev in zip(names, series_commits(git, manifest), strict=True):
        for path, blob in blobs_of(files_at(git, rev, manifest)).items():
            if blob is None:
                problem, keep = f"{path} does not exist after {name}", "the series must keep it"
                raise BackportError(Exit.PATCHSET_INVALID, problem, keep)
            blobs[path][step_of(name)] = blob
    (out / SERIES_NAME).write_text(SERIES_HEADER + "".join(f"{n}\n" for n in names))
    committed = (series.folder / MANIFEST_NAME).read_text(encoding="utf-8")
    tables = {
        "patches": {name: sha256_of(out / name) for name in names},
        "blobs": {path: by_step for path, by_step in blobs.items() if by_step},
    }
    (out / MANIFEST_NAME).write_text(rewrite_tables(committed, tables), encoding="utf-8")
    return names


def _exported_files(folder: Path) -> dict[str, bytes]:
    # Bytes, not text: text mode would read a CRLF file as current.
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.is_file() and (p.suffix == ".patch" or p.name in (SERIES_NAME, MANIFEST_NAME))
    }


def _fresh_export(series: Series, build: Path) -> tuple[list[str], dict[str, bytes]]:
    with marked_folder(tmpdir(), "sglang-backports-export-") as tmp:
        return export_to(series, build_tree_path(series, build), tmp), _exported_files(tmp)


def stale_diff(series: Series, build: Path) -> str:
    fresh, committed = _fresh_export(series, build)[1], _exported_files(series.folder)
    chunks: list[bytes] = []
    for name in sorted(set(fresh) | set(committed)):
        old, new = (files.get(name, b"").splitlines(keepends=True) for files in (committed, fresh))
        names = f"committed/{name}".encode(), f"exported/{name}".encode()
        chunks += difflib.diff_bytes(difflib.unified_diff, old, new, *names)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r", "\\r")


def export_in_place(series: Series, build: Path) -> list[str]:
    names, files = _fresh_export(series, build)
    for old in series.folder.glob("*.patch"):
        old.unlink()
    for name, data in files.items():
        (series.folder / name).write_bytes(data)
    return names
