"""Check a base against the pin, then apply the series on a branch of its own."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import wheel as wheels
from .buildtree import build_tree_path, default_branch, pristine_tag, read_blob
from .errors import BackportError, Exit
from .git import PROJECT_IDENTITY, Git, open_checkout
from .lock import DEFAULT_WAIT_S, deferred_signals, held
from .manifest import (
    BASE_STEP,
    PinManifest,
    Series,
    git_blob_id,
    patch_set_folders,
    release_key,
    step_of,
)
from .paths import DEFAULT_BASE

# The lock of a user's repository: a file in its git folder while a run holds it.
LOCK_NAME = "sglang-backports.lock"


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
    blobs = _blobs_of(files)
    every = [Series.load(folder) for folder in patch_set_folders(root)]
    for series in every:
        if series.manifest.files != list(files):
            continue
        if any(blobs == series.manifest.blobs_at(step) for step in series.manifest.steps):
            return series
    served = [release for series in every for release in series.manifest.releases]
    default = Series.load(root / f"sglang-{DEFAULT_BASE}")
    headline = f"{where} holds none of the sglang releases served here ({', '.join(served)}):"
    raise _mismatch(default.manifest, blobs, _reader(files), where, headline)


@dataclass
class ApplyReport:
    where: Path
    branch: str | None  # None: the checkout's HEAD already holds the series
    applied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)

    @property
    def already_applied(self) -> bool:
        return not self.applied


def _blobs_at(git: Git, rev: str, manifest: PinManifest) -> dict[str, str | None]:
    return git.blobs_at(rev, manifest.files)


def _refuse_unclean(git: Git, where: Path) -> None:
    operation = git.operation_in_progress()
    if operation:
        raise BackportError(
            Exit.DIRTY_TREE,
            f"{where} is in the middle of a {operation}",
            "finish or abort it there first; nothing was changed",
        )
    dirty = git.dirty_files()
    if dirty:
        raise BackportError(
            Exit.DIRTY_TREE,
            f"{where} has uncommitted changes to tracked files: {', '.join(dirty)}",
            "commit them (or move them aside yourself) and run again; nothing was changed",
        )


def _blobs_of(files: dict[str, bytes | None]) -> dict[str, str | None]:
    return {path: git_blob_id(data) if data is not None else None for path, data in files.items()}


def _reader(files: dict[str, bytes | None]) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        data = files.get(path)
        return data.decode("utf-8", "replace") if data is not None else None

    return read


def _head_reader(git: Git) -> Callable[[str], str | None]:
    """Reads HEAD's files only when a refusal needs their text."""

    def read(path: str) -> str | None:
        data = read_blob(git, "HEAD", path)
        return data.decode("utf-8", "replace") if data is not None else None

    return read


def _patches_after(series: Series, step: str) -> list[Path]:
    steps = series.manifest.steps
    done = steps.index(step)
    return series.patch_paths[done:]


# What this command leaves behind only when it is killed: temporary folders
# named TEMP_PREFIX..., each holding a MARKER file that names the repository
# it was made for. The next run on that repository removes them (leftovers).
TEMP_PREFIX = "sglang-backports-apply-"
MARKER = "made-by-sglang-backports"
# Our worktree's folder name. git names the worktree's record in
# .git/worktrees/ after it (adding a number when taken), so a record a killed
# `git worktree add` left half-written is still known as ours by its name.
WORKTREE_NAME = "sglang-backports-worktree"
# The name this command's worktrees had before; their records are still ours.
OLD_WORKTREE_NAMES = ("tree",)


def _temp_folder(parent: Path | None, owner: Path) -> Path:
    # Made and marked in one go, so no folder of ours is ever without its marker.
    with deferred_signals():
        tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent))
        (tmp / MARKER).write_text(f"{owner}\n", encoding="utf-8")
    return tmp


def _is_ours(folder: Path, owner: Path) -> bool:
    """A temporary folder this command made for owner (a repository or build tree)."""
    if not folder.name.startswith(TEMP_PREFIX):
        return False
    try:
        return (folder / MARKER).read_text(encoding="utf-8").strip() == str(owner)
    except OSError:
        return False


def _remove_folder(folder: Path) -> None:
    with deferred_signals():
        shutil.rmtree(folder, ignore_errors=True)


def _am_series(work: Git, series: Series, patches: list[Path]) -> list[str]:
    """git am each patch onto work's HEAD, checking the files after each one."""
    applied: list[str] = []
    for patch in patches:
        result = work.run("am", "--quiet", "--no-3way", str(patch), check=False)
        if result.returncode != 0:
            work.run("am", "--abort", check=False)
            detail = (result.stdout + result.stderr).strip()
            raise BackportError(
                Exit.APPLY_FAILED,
                f"patch {patch.name} did not apply:\n{detail}",
                "everything this run changed was rolled back; the base or the "
                "patch differs from what the manifest pins, so refresh the "
                "patch on the pristine base and run scripts/export-patches",
            )
        applied.append(patch.name)
        expected = series.manifest.blobs_at(step_of(patch.name))
        produced = _blobs_at(work, "HEAD", series.manifest)
        if produced != expected:
            wrong = [p for p in expected if produced[p] != expected[p]]
            raise BackportError(
                Exit.APPLY_FAILED,
                f"patch {patch.name} applied, but produced other content than "
                f"the manifest pins for: {', '.join(wrong)}",
                "everything this run changed was rolled back; regenerate the "
                "manifest with scripts/export-patches",
            )
    return applied


def _apply_on_new_branch(
    git: Git, series: Series, branch: str, patches: list[Path], temp_parent: Path | None
) -> list[str]:
    """git am the patches in a temporary detached worktree, then create the branch.

    The caller's work tree, index and current branch are never touched. The
    branch is created last, in one step, only when every patch applied; until
    then the repository gains nothing but the worktree, which is removed again
    whatever happens (and by the next run if this one is killed).
    """
    owner = git.common_dir
    tmp = _temp_folder(temp_parent, owner)
    tree = tmp / WORKTREE_NAME
    try:
        git.run("worktree", "add", "--quiet", "--detach", str(tree), "HEAD")
        work = Git(tree, owned=git.owned, extra_env=git.extra_env)
        applied = _am_series(work, series, patches)
        # An empty old value: refuse to overwrite a branch made meanwhile.
        git.run("update-ref", f"refs/heads/{branch}", work.out("rev-parse", "HEAD"), "")
        return applied
    finally:
        with deferred_signals():
            git.run("worktree", "remove", "--force", "--force", str(tree), check=False)
            shutil.rmtree(tmp, ignore_errors=True)


def remove_leftovers(git: Git, temp_parent: Path | None) -> list[Path]:
    """Remove what a killed run of this command left in git's repository.

    Only worktrees inside our marked temporary folders are touched, each by its
    path; a worktree whose folder is gone loses just its record, and only when
    that record points into a folder named as ours. Nothing is pruned.
    """
    owner = git.common_dir
    parent = temp_parent or Path(tempfile.gettempdir())
    # Before the listing, which fails on them.
    records = _half_written_records(owner)
    for record in records:
        _remove_folder(record)
    removed: list[Path] = []
    listing = git.run("worktree", "list", "--porcelain", "-z").stdout
    for entry in listing.split("\0\0"):
        line = entry.split("\0", 1)[0]
        if not line.startswith("worktree "):
            continue
        tree = Path(line[len("worktree ") :])
        folder = tree.parent
        if tree.name not in (WORKTREE_NAME, *OLD_WORKTREE_NAMES):
            continue
        if not folder.name.startswith(TEMP_PREFIX):
            continue
        if folder.exists():
            if not _is_ours(folder, owner):
                continue
            git.run("worktree", "remove", "--force", "--force", str(tree), check=False)
        else:
            _forget_worktree(owner, tree)
        removed.append(folder)
    for folder in parent.glob(TEMP_PREFIX + "*"):
        if _is_ours(folder, owner):
            removed.append(folder)
    for folder in removed:
        _remove_folder(folder)
    return records + removed


def _is_ours_by_name(record: str) -> bool:
    """A worktree record git named after our worktree: the name, maybe a number after it."""
    rest = record.removeprefix(WORKTREE_NAME)
    return record.startswith(WORKTREE_NAME) and (rest == "" or rest.isdigit())


def _half_written_records(common: Path) -> list[Path]:
    """Our worktree records that a killed `git worktree add` left without its files.

    git writes a record's files one by one; killed in between, it leaves one
    whose `commondir` (or `gitdir`) is missing or still empty, on which `git
    worktree list` itself fails. Such a record named after our worktree is
    removed (git's own `worktree prune` would do it, but it would also touch
    the user's records).
    """
    records = common / "worktrees"
    return [
        record
        for record in (records.iterdir() if records.is_dir() else [])
        if _is_ours_by_name(record.name)
        and not (_holds_text(record / "commondir") and _holds_text(record / "gitdir"))
    ]


def _holds_text(path: Path) -> bool:
    try:
        return bool(path.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return False


def _forget_worktree(common: Path, tree: Path) -> None:
    """Drop the record of our worktree whose folder is already gone."""
    records = common / "worktrees"
    for record in records.iterdir() if records.is_dir() else []:
        try:
            gitdir = (record / "gitdir").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if Path(gitdir) == tree / ".git":
            _remove_folder(record)


def apply_to_checkout(
    git: Git, series: Series, branch: str, where: Path, temp_parent: Path | None = None
) -> ApplyReport:
    """Apply what is missing of the series to HEAD of git, on a new branch."""
    manifest = series.manifest
    report = ApplyReport(where=where, branch=branch)
    if git.branch_exists(branch):
        tip = f"refs/heads/{branch}"
        if _blobs_at(git, tip, manifest) == manifest.blobs_at(manifest.final_step):
            report.already = list(series.patch_names)
            return report
        if git.owned:
            next_step = (
                "the build tree holds another version of the series; if you have no "
                f"unexported work there, delete {where} (it is generated) and run again"
            )
        else:
            next_step = (
                f"delete it (`git -C {where} branch -D {branch}`) or pass --branch "
                "with another name"
            )
        raise BackportError(
            Exit.BRANCH_EXISTS,
            f"branch {branch} already exists in {where} and does not hold the patched files",
            next_step,
        )
    state = locate_step(manifest, _blobs_at(git, "HEAD", manifest), _head_reader(git), str(where))
    patches = _patches_after(series, state)
    report.already = [p for p in series.patch_names if p not in {x.name for x in patches}]
    if not patches:
        report.branch = None
        return report
    if not git.owned and not git.run("config", "user.email", check=False).stdout.strip():
        git.extra_env.update(
            {k: v for k, v in PROJECT_IDENTITY.items() if k.startswith("GIT_COMMITTER_")}
        )
    report.applied = _apply_on_new_branch(git, series, branch, patches, temp_parent)
    return report


def apply_to_user_checkout(
    series: Series, path: Path, branch: str | None, wait_s: float = DEFAULT_WAIT_S
) -> ApplyReport:
    series.verify()
    git = open_checkout(path)
    with held(git.common_dir / LOCK_NAME, f"the repository {path}", wait_s):
        remove_leftovers(git, None)
        _refuse_unclean(git, path)
        return apply_to_checkout(git, series, branch or default_branch(series.manifest), path)


def _lay_out_wheel(series: Series, repo: Path, cache: Path) -> None:
    manifest = series.manifest
    wheel = wheels.fetch_wheel(manifest.base, cache)
    repo.mkdir()
    wheels.extract_package(wheel, repo)
    git = Git(repo, owned=True)
    git.run("init", "--quiet", "--initial-branch=upstream")
    git.run("add", "--all")
    git.run(
        "commit", "--quiet", "--no-verify", "-m",
        f"sglang {manifest.base.version}, laid out from {manifest.base.wheel}\n\n"
        f"sha256 {manifest.base.sha256}; the wheel's sglang/ is python/sglang/.",
    )  # fmt: skip
    git.run("tag", pristine_tag(manifest))


def _build_aside(series: Series, repo: Path, cache: Path) -> ApplyReport:
    """Make the patched build tree in a marked sibling folder, then rename it into place."""
    tmp = _temp_folder(repo.parent, repo)
    try:
        aside = tmp / repo.name
        _lay_out_wheel(series, aside, cache)
        git = Git(aside, owned=True)
        branch = default_branch(series.manifest)
        git.run("switch", "--quiet", "--create", branch)
        report = ApplyReport(where=repo, branch=branch)
        report.applied = _am_series(git, series, series.patch_paths)
        # One rename on one file system: a reader sees no tree or the whole one.
        os.rename(aside, repo)
        return report
    finally:
        _remove_folder(tmp)


def apply_to_build_tree(
    series: Series, build: Path, cache: Path, wait_s: float = DEFAULT_WAIT_S
) -> ApplyReport:
    """The default: a git tree from the pinned wheel in the build folder, patched."""
    series.verify()
    repo = build_tree_path(series, build)
    if not repo.exists():
        # Fetched before anything is made: a wheel that cannot be had leaves no trace.
        wheels.fetch_wheel(series.manifest.base, cache)
    build.mkdir(parents=True, exist_ok=True)
    with held(build / f".{repo.name}.lock", f"the build tree {repo}", wait_s):
        for folder in build.glob(TEMP_PREFIX + "*"):
            if _is_ours(folder, repo) or (folder.is_dir() and not any(folder.iterdir())):
                _remove_folder(folder)
        if not repo.exists():
            return _build_aside(series, repo, cache)
        git = Git(repo, owned=True)
        if git.rev("HEAD") is None or git.rev(pristine_tag(series.manifest)) is None:
            raise BackportError(
                Exit.NOT_A_CHECKOUT,
                f"{repo} exists but is not a tree this command made",
                "move it aside or delete it (it is generated) and run again",
            )
        remove_leftovers(git, build)
        _refuse_unclean(git, repo)
        branch = default_branch(series.manifest)
        report = apply_to_checkout(git, series, branch, repo, temp_parent=build)
        if report.branch and git.current_branch() != branch:
            git.run("checkout", "--quiet", branch)
        return report


@contextmanager
def scratch_copy(files: dict[str, bytes | None]) -> Iterator[Path]:
    """A temporary folder holding copies of the files, for `git apply` to work on."""
    with tempfile.TemporaryDirectory(prefix="sglang-backports-scratch-") as tmp:
        scratch = Path(tmp)
        for path, data in files.items():
            if data is not None:
                (scratch / path).parent.mkdir(parents=True, exist_ok=True)
                (scratch / path).write_bytes(data)
        yield scratch


def git_apply(cwd: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return Git(cwd, owned=True).run("apply", *flags, str(patch), check=False)


@dataclass
class CheckResult:
    patch: str
    status: str  # "already applied", "applies cleanly", "does not apply"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "does not apply"


def check_series(series: Series, files: dict[str, bytes | None], where: str) -> list[CheckResult]:
    """Per patch, whether it would apply to these files; touches nothing of theirs."""
    manifest = series.manifest
    state = locate_step(manifest, _blobs_of(files), _reader(files), where)
    pending = {p.name for p in _patches_after(series, state)}
    results: list[CheckResult] = []
    with scratch_copy(files) as scratch:
        blocked = False
        for patch in series.patch_paths:
            if patch.name not in pending:
                results.append(CheckResult(patch.name, "already applied"))
                continue
            if blocked:
                results.append(CheckResult(patch.name, "does not apply", "an earlier patch failed"))
                continue
            check = git_apply(scratch, patch, "--check")
            if check.returncode == 0:
                git_apply(scratch, patch)
                results.append(CheckResult(patch.name, "applies cleanly"))
            else:
                blocked = True
                results.append(CheckResult(patch.name, "does not apply", check.stderr.strip()))
    return results


def files_per_step(series: Series, base_files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    """The touched files at every step: the series applied to copies of the base's files.

    Each step's files are checked against the manifest's blob ids, so what a
    caller gets is exactly what the manifest pins.
    """
    manifest = series.manifest
    where = manifest.base.wheel
    steps = manifest.steps
    per_step = {steps[0]: dict(base_files)}
    with scratch_copy(dict(base_files)) as scratch:
        for patch in series.patch_paths:
            result = git_apply(scratch, patch)
            if result.returncode != 0:
                raise BackportError(
                    Exit.APPLY_FAILED,
                    f"patch {patch.name} does not apply to the files of {where}:\n"
                    f"{result.stderr.strip()}",
                    "run scripts/lint-patches and scripts/apply-patches --check to see why",
                )
            per_step[step_of(patch.name)] = {p: (scratch / p).read_bytes() for p in base_files}
    for step, files in per_step.items():
        if _blobs_of(dict(files)) != manifest.blobs_at(step):
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"the files of {where} at step {step} are not the ones "
                f"{series.folder.name}'s manifest pins ([blobs])",
                "restore the patch set with `git checkout -- patches/`, or regenerate "
                "the manifest with scripts/export-patches",
            )
    return per_step
