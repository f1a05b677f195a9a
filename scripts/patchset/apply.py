"""Check a base against the pin, then apply the series on a branch of its own."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import wheel as wheels
from .buildtree import (
    build_tree_path,
    default_branch,
    files_at,
    pristine_tag,
)
from .errors import BackportError, Exit
from .git import Git, open_checkout
from .manifest import BASE_STEP, PinManifest, Series, git_blob_id, release_key, step_of


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
) -> BackportError:
    version = manifest.base.version
    expected = manifest.blobs_at(BASE_STEP)
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
    marker = manifest.fix_marker
    has_marker = bool(marker) and any(marker in (read_file(path) or "") for path in blobs)
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
        lines.append("It matches no sglang release this series knows.")
    return BackportError(
        Exit.BASE_MISMATCH,
        "\n".join(lines),
        f"check out tag {manifest.tag} (or use the default, the pinned wheel); "
        "for other releases a patch set of their own is needed under patches/",
    )


@dataclass
class ApplyReport:
    where: Path
    branch: str
    applied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)

    @property
    def already_applied(self) -> bool:
        return not self.applied


def _blobs_at(git: Git, rev: str, manifest: PinManifest) -> dict[str, str | None]:
    return {path: git.blob_at(rev, path) for path in manifest.files}


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


def _patches_after(series: Series, step: str) -> list[Path]:
    steps = series.manifest.steps
    done = steps.index(step)
    return series.patch_paths[done:]


def _apply_on_new_branch(
    git: Git, series: Series, start: str, branch: str, patches: list[Path]
) -> list[str]:
    """git am the patches on a new branch in a temporary worktree.

    The caller's work tree, index and current branch are never touched. On any
    failure the worktree and the branch are removed again and the error raised.
    """
    tmp = Path(tempfile.mkdtemp(prefix="sglang-backports-"))
    tree = tmp / "tree"
    applied: list[str] = []
    git.run("worktree", "add", "--quiet", "-b", branch, str(tree), start)
    work = Git(tree, owned=git.owned, extra_env=git.extra_env)
    try:
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
    except BaseException:
        git.run("worktree", "remove", "--force", str(tree), check=False)
        git.run("branch", "-D", branch, check=False)
        raise
    finally:
        git.run("worktree", "remove", "--force", str(tree), check=False)
        git.run("worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return applied


def apply_to_checkout(git: Git, series: Series, branch: str, where: Path) -> ApplyReport:
    """Apply what is missing of the series to HEAD of git, on a new branch."""
    manifest = series.manifest
    report = ApplyReport(where=where, branch=branch)
    if git.branch_exists(branch):
        tip = f"refs/heads/{branch}"
        if _blobs_at(git, tip, manifest) == manifest.blobs_at(manifest.steps[-1]):
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
    state = locate_step(
        manifest,
        _blobs_at(git, "HEAD", manifest),
        _reader(files_at(git, "HEAD", manifest)),
        str(where),
    )
    patches = _patches_after(series, state)
    report.already = [p for p in series.patch_names if p not in {x.name for x in patches}]
    if not patches:
        return report
    if not git.owned and not git.run("config", "user.email", check=False).stdout.strip():
        git.extra_env.update(
            GIT_COMMITTER_NAME="sglang-backports",
            GIT_COMMITTER_EMAIL="sglang-backports@localhost",
        )
    report.applied = _apply_on_new_branch(git, series, "HEAD", branch, patches)
    return report


def apply_to_user_checkout(series: Series, path: Path, branch: str | None) -> ApplyReport:
    series.verify()
    git = open_checkout(path)
    _refuse_unclean(git, path)
    return apply_to_checkout(git, series, branch or default_branch(series.manifest), path)


def _lay_out_wheel(series: Series, repo: Path, cache: Path) -> None:
    manifest = series.manifest
    wheel = wheels.fetch_wheel(manifest.base, cache)
    repo.mkdir(parents=True)
    wheels.extract_package(wheel, repo)
    git = Git(repo, owned=True)
    git.run("init", "--quiet", "--initial-branch=upstream")
    git.run("add", "--all")
    git.run(
        "commit", "--quiet", "-m",
        f"sglang {manifest.base.version}, laid out from {manifest.base.wheel}\n\n"
        f"sha256 {manifest.base.sha256}; the wheel's sglang/ is python/sglang/.",
    )  # fmt: skip
    git.run("tag", pristine_tag(manifest))


def apply_to_build_tree(series: Series, build: Path, cache: Path) -> ApplyReport:
    """The default: a git tree from the pinned wheel in the build folder, patched."""
    series.verify()
    repo = build_tree_path(series, build)
    created = not repo.exists()
    try:
        if created:
            _lay_out_wheel(series, repo, cache)
        git = Git(repo, owned=True)
        if git.rev("HEAD") is None or git.rev(pristine_tag(series.manifest)) is None:
            raise BackportError(
                Exit.NOT_A_CHECKOUT,
                f"{repo} exists but is not a tree this command made",
                "move it aside or delete it (it is generated) and run again",
            )
        _refuse_unclean(git, repo)
        branch = default_branch(series.manifest)
        report = apply_to_checkout(git, series, branch, repo)
        if git.current_branch() != branch:
            git.run("checkout", "--quiet", branch)
        return report
    except BaseException:
        if created:
            shutil.rmtree(repo, ignore_errors=True)
        raise


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
