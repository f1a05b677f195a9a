"""Apply the series with plumbing only: a temporary index, then one ref update makes the branch."""

import os
import shlex
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import lock, patchfile
from . import wheel as wheels
from .buildtree import build_tree_path, default_branch, files_at, pristine_tag
from .catalog import Files, blobs_of, reading, recognise
from .errors import BackportError, Exit
from .git import PROJECT_IDENTITY, Git, GitError, open_checkout
from .manifest import Series, step_of

LOCK_NAME = "sglang-backports.lock"  # in a user's git folder while a run holds it
TEMP_PREFIX = "sglang-backports-apply-"
RESTORE = "restore the patch set with `git checkout -- patches/`"
ROLLED_BACK = "this run changed nothing of yours (its work was rolled back)"
OntoFork = Callable[[Git, str, Files], "ApplyReport"]  # --3way's, given (git, HEAD, its files)
OPERATIONS = (
    ("rebase-apply", "git am or rebase"),
    ("rebase-merge", "rebase"),
    ("MERGE_HEAD", "merge"),
    ("CHERRY_PICK_HEAD", "cherry-pick"),
)


@dataclass
class ApplyReport:
    where: Path
    branch: str | None  # None: the checkout's HEAD already holds the series
    applied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # --3way: the merge and its judgement


def _refuse_unclean(git: Git, where: Path) -> None:
    git_dir = Path(git.out("rev-parse", "--absolute-git-dir"))
    if operation := next((name for mark, name in OPERATIONS if (git_dir / mark).exists()), None):
        raise BackportError(
            Exit.DIRTY_TREE,
            f"{where} is in the middle of a {operation}",
            "finish or abort it there first; nothing was changed",
        )
    # Changed tracked files under the prefix, read with every filter driver off (none runs).
    off = dict.fromkeys(("clean", "smudge", "process"), "") | {"required": "false"}
    pathspec = ["--", f":(literal){git.prefix}"] if git.prefix else []
    status = ["status", "--porcelain=v1", "-z", "--untracked-files=no", "--no-renames"]
    listing = git.overriding("filter", "[^.]*", off)[0].run(*status, *pathspec).stdout
    if dirty := [entry[3:] for entry in listing.split("\0") if entry]:  # "XY path"
        raise BackportError(
            Exit.DIRTY_TREE,
            f"{where} has uncommitted changes to tracked files: {', '.join(dirty)}",
            "commit them (or move them aside yourself) and run again; nothing was changed",
        )


def _patches_after(series: Series, step: str) -> list[Path]:
    return series.patch_paths[series.manifest.steps.index(step) :]


def verify(series: Series, hashes: bool = True) -> None:
    """Refuse a damaged series before anything is written: hashes, each patch as git reads it."""
    if hashes:
        series.verify()
    allowed = set(series.manifest.files)
    for patch in series.patch_paths:
        touched, problem = patchfile.touched_paths(patch)
        if problem:
            raise BackportError(
                Exit.PATCHSET_INVALID, f"git cannot read patch {patch.name}: {problem}", RESTORE
            )
        if others := sorted(set(touched) - allowed):
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"patch {patch.name} touches {', '.join(others)}, outside the files this "
                f"series may change ({', '.join(sorted(allowed))}); nothing was changed",
                f"{RESTORE}; a fix that needs another file must add it to the manifest's "
                "[blobs] and pass lint-patches",
            )
        if events := patchfile.file_events(patch):
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"patch {patch.name} does more than change lines of the series' files "
                f"({'; '.join(events)}); nothing was changed",
                RESTORE,
            )


def commit_patch(git: Git, patch: Path, tree: str, parent: str, scratch: Path, note: str) -> str:
    """Commit tree onto parent with the patch's message (and note) and author, as `git am` would."""
    msg = scratch / "msg"
    info = git.run(
        "mailinfo", "--no-scissors", str(msg), os.devnull, input=patch.read_text(encoding="utf-8")
    ).stdout
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
    body = msg.read_text(encoding="utf-8")
    message = git.run("stripspace", input=f"{fields.get('Subject', '')}\n\n{body}").stdout
    names = {"GIT_AUTHOR_NAME": "Author", "GIT_AUTHOR_EMAIL": "Email", "GIT_AUTHOR_DATE": "Date"}
    author = git.with_env({var: fields[key] for var, key in names.items() if fields.get(key)})
    return author.run("commit-tree", tree, "-p", parent, input=message + note).stdout.strip()


def _commit_series(git: Git, series: Series, tip: str, patches: list[Path], scratch: Path) -> str:
    """Commit each patch onto tip via a temporary index (no fuzz), each step's tree checked."""
    index = git.with_env({"GIT_INDEX_FILE": str(scratch / "index")})  # ours, not the repository's
    # Where sglang is vendored, its paths are the patches' under the prefix.
    apply = ["apply", "--cached", *([f"--directory={git.prefix}"] if git.prefix else [])]
    index.run("read-tree", tip)
    for patch in patches:
        # Only when the one atomic apply fails does --check tell a patch that does not
        # fit (ours to report) from git failing to write (git's reason).
        if index.run(*apply, str(patch), check=False).returncode != 0:
            if (check := index.run(*apply, "--check", str(patch), check=False)).returncode:
                raise BackportError(
                    Exit.APPLY_FAILED,
                    f"patch {patch.name} did not apply:\n{(check.stdout + check.stderr).strip()}",
                    f"{ROLLED_BACK}; the base or the patch differs from what the manifest pins, "
                    "so refresh the patch on the pristine base and run scripts/export-patches",
                )
            index.run(*apply, str(patch))
        tree = index.out("write-tree")
        expected = series.manifest.blobs_at(step_of(patch.name))
        if (produced := blobs_of(files_at(git, tree, series.manifest))) != expected:
            wrong = [p for p in expected if produced[p] != expected[p]]
            raise BackportError(
                Exit.APPLY_FAILED,
                f"patch {patch.name} applied, but produced other content than "
                f"the manifest pins for: {', '.join(wrong)}",
                f"{ROLLED_BACK}; regenerate the manifest with scripts/export-patches",
            )
        tip = commit_patch(git, patch, tree, tip, scratch, "")
    return tip


def create_branch(git: Git, branch: str, commit: str, where: Path) -> None:
    """One ref update, refused if the branch appeared meanwhile; then signals stay held: done."""
    lock.hold_interrupts()
    result = git.run("update-ref", f"refs/heads/{branch}", commit, "0" * len(commit), check=False)
    if result.returncode == 0:
        return
    lock.release_interrupts()
    if git.branch_exists(branch):
        raise BackportError(
            Exit.BRANCH_EXISTS,
            f"branch {branch} was created in {where} by someone else while this run worked",
            "nothing of yours was changed; look at that branch, then delete it or pass "
            "--branch with another name",
        )
    refuse_clash(git, branch, where)
    raise GitError(["update-ref", f"refs/heads/{branch}"], result)


def refuse_clash(git: Git, branch: str, where: Path) -> None:
    """Refuse a branch name that an existing ref keeps git from making (a/b beside a)."""
    ref, top = f"refs/heads/{branch}", "refs/heads/" + branch.split("/", 1)[0]
    listed = git.run("for-each-ref", "--format=%(refname)", top).stdout.split()
    if clashes := [r for r in listed if ref.startswith(r + "/") or r.startswith(ref + "/")]:
        raise BackportError(
            Exit.BRANCH_EXISTS,
            f"branch {branch} cannot be made in {where}: git keeps refs as files and "
            f"folders, and {clashes[0]} is in its way",
            f"pass --branch with another name (e.g. --branch "
            f"{shlex.quote(branch.replace('/', '-'))}); nothing of yours was changed",
        )


def _apply_to_checkout(
    git: Git, series: Series, branch: str, where: Path, at: tuple[str, str] | None
) -> ApplyReport:
    """Apply what HEAD misses of the series on a new branch; at: (HEAD, its step) if known."""
    manifest = series.manifest
    if git.branch_exists(branch):
        held = blobs_of(files_at(git, f"refs/heads/{branch}", manifest))
        if held == manifest.blobs_at(manifest.final_step):
            return ApplyReport(where, branch, already=list(series.patch_names))
        next_step = (
            "the build tree holds another version of the series; if you have no "
            f"unexported work there, delete {where} (it is generated) and run again"
            if git.owned
            else delete_or_rename(branch, where)
        )
        raise BackportError(
            Exit.BRANCH_EXISTS,
            f"branch {branch} already exists in {where} and does not hold the patched files",
            next_step,
        )
    refuse_clash(git, branch, where)
    if at is None:
        head = _head(git)
        at = head, recognise(files_at(git, head, manifest), str(where), series, False)[1]
    patches = _patches_after(series, at[1])
    already = series.patch_names[: len(series.patch_names) - len(patches)]
    if not patches:
        return ApplyReport(where, None, already=already)
    commit_identity(git)
    # The build tree's folder is beside it, so the next run there removes what a kill left.
    temp = where.parent if git.owned else lock.tmpdir()
    with lock.marked_folder(temp, TEMP_PREFIX) as scratch:
        tip = _commit_series(git, series, at[0], patches, scratch)
        create_branch(git, branch, tip, where)
    return ApplyReport(where, branch, [p.name for p in patches], already)


def delete_or_rename(branch: str, where: Path) -> str:
    delete = shlex.join(["git", "-C", str(where), "branch", "-D", branch])
    return f"delete it (`{delete}`) or pass --branch with another name"


def commit_identity(git: Git) -> None:
    """Commit in a user's repository as the user; where git knows no identity, as ours."""
    if not git.owned and not git.run("config", "user.email", check=False).stdout.strip():
        git.extra_env.update({k: v for k, v in PROJECT_IDENTITY.items() if "COMMITTER" in k})


def _head(git: Git) -> str:
    return git.out("rev-parse", "--verify", "HEAD^{commit}")


def apply_to_user_checkout(
    path: Path, branch: str | None, wait_s: float, series: Series | None, onto_fork: OntoFork | None
) -> ApplyReport:
    """Recognise HEAD once under the lock and apply; a fork goes to onto_fork (--3way) if given."""
    git = open_checkout(path)
    if series is not None:
        verify(series)
    # in the repository's own git folder, shared by all its worktrees
    common = Path(git.out("rev-parse", "--path-format=absolute", "--git-common-dir"))
    with lock.held(common / LOCK_NAME, f"the repository {path}", wait_s):
        lock.remove_leftovers(lock.tmpdir(), TEMP_PREFIX)
        _refuse_unclean(git, path)
        head = _head(git)
        files = files_at(git, head, reading(series).manifest)
        try:
            found, step = recognise(files, str(path), series, True)
        except BackportError as refused:
            if onto_fork is None or refused.code != Exit.BASE_MISMATCH:
                raise
            return onto_fork(git, head, files)
        if found is not series:  # a given series was verified before the lock
            verify(found)
        branch = branch or default_branch(found.manifest)
        return _apply_to_checkout(git, found, branch, path, (head, step))


def _build_aside(series: Series, repo: Path, cache: Path) -> ApplyReport:
    """The pinned wheel as a tagged, patched git tree in a marked sibling, renamed into place."""
    manifest = series.manifest
    wheel = wheels.fetch_wheel(manifest.base, cache)
    with lock.marked_folder(repo.parent, TEMP_PREFIX) as tmp:
        aside = tmp / repo.name
        aside.mkdir()
        wheels.extract_package(wheel, aside)
        git = Git(aside, owned=True)
        git.run("init", "--quiet", "--initial-branch=upstream")
        git.run("add", "--all")
        git.run(
            "commit", "--quiet", "--no-verify", "-m",
            f"sglang {manifest.base.version}, laid out from {manifest.base.wheel}\n\n"
            f"sha256 {manifest.base.sha256}; the wheel's sglang/ is python/sglang/.",
        )  # fmt: skip
        git.run("tag", pristine_tag(manifest))
        branch = default_branch(manifest)
        tip = _commit_series(git, series, _head(git), series.patch_paths, tmp)
        git.run("checkout", "--quiet", "-b", branch, tip)
        # One rename on one file system: a reader sees no tree or the whole one,
        # and once it is there the run has succeeded, whatever signal comes late.
        lock.hold_interrupts()
        try:
            os.rename(aside, repo)
        except BaseException:
            lock.release_interrupts()
            raise
        return ApplyReport(where=repo, branch=branch, applied=list(series.patch_names))


def apply_to_build_tree(
    series: Series, build: Path, cache: Path, wait_s: float = lock.DEFAULT_WAIT_S
) -> ApplyReport:
    verify(series)
    repo = build_tree_path(series, build)
    if not repo.exists():
        # Fetched before anything is made: a wheel that cannot be had leaves no trace.
        wheels.fetch_wheel(series.manifest.base, cache)
    build.mkdir(parents=True, exist_ok=True)
    with lock.held(build / f".{repo.name}.lock", f"the build tree {repo}", wait_s):
        lock.remove_leftovers(build, TEMP_PREFIX)
        if not repo.exists():
            return _build_aside(series, repo, cache)
        git = Git(repo, owned=True)
        if git.rev("HEAD") is None or git.rev(pristine_tag(series.manifest)) is None:
            raise BackportError(
                Exit.NOT_A_CHECKOUT,
                f"{repo} exists but is not a tree this command made",
                "move it aside or delete it (it is generated) and run again",
            )
        _refuse_unclean(git, repo)
        report = _apply_to_checkout(git, series, default_branch(series.manifest), repo, None)
        if report.branch:  # on it already: a checkout that changes nothing
            git.run("checkout", "--quiet", report.branch)
        return report


@contextmanager
def scratch_copy(files: Files) -> Iterator[Path]:
    with lock.marked_folder(lock.tmpdir(), "sglang-backports-scratch-") as scratch:
        for path, data in files.items():
            if data is not None:
                (scratch / path).parent.mkdir(parents=True, exist_ok=True)
                (scratch / path).write_bytes(data)
        yield scratch


def git_apply(cwd: Path, patch: Path) -> subprocess.CompletedProcess[str]:
    """`git apply` in cwd: atomic, so a patch that does not apply changes nothing."""
    return Git(cwd, owned=True).run("apply", str(patch), check=False)


FAILS = "does not apply"


def check_series(series: Series, state: str, files: Files) -> dict[str, str]:
    """Per patch: "already applied", "applies cleanly", or FAILS and why on lines below."""
    pending = _patches_after(series, state)
    results = dict.fromkeys(series.patch_names, "already applied")
    results |= {patch.name: f"{FAILS}\nan earlier patch failed" for patch in pending}
    with scratch_copy(files) as scratch:
        for patch in pending:
            if (done := git_apply(scratch, patch)).returncode != 0:
                results[patch.name] = f"{FAILS}\n{done.stderr.strip()}".strip()
                break
            results[patch.name] = "applies cleanly"
    return results


def files_per_step(series: Series, base_files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    verify(series, hashes=False)
    manifest = series.manifest
    where = manifest.base.wheel
    per_step = {manifest.steps[0]: dict(base_files)}
    with scratch_copy(dict(base_files)) as scratch:
        for patch in series.patch_paths:
            if (result := git_apply(scratch, patch)).returncode != 0:
                raise BackportError(
                    Exit.APPLY_FAILED,
                    f"patch {patch.name} does not apply to the files of {where}:\n"
                    f"{result.stderr.strip()}",
                    "run scripts/lint-patches and scripts/apply-patches --check to see why",
                )
            per_step[step_of(patch.name)] = {p: (scratch / p).read_bytes() for p in base_files}
    for step, files in per_step.items():
        if blobs_of(dict(files)) != manifest.blobs_at(step):
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"the files of {where} at step {step} are not the ones "
                f"{series.folder.name}'s manifest pins ([blobs])",
                f"{RESTORE}, or regenerate the manifest with scripts/export-patches",
            )
    return per_step
