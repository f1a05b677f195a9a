"""A thin wrapper over the git command line."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .errors import BackportError, Exit, GitError
from .lock import deferred_signals, held_fds

# Identity for commits in repositories this project owns (the build tree).
PROJECT_IDENTITY = {
    "GIT_AUTHOR_NAME": "sglang-backports",
    "GIT_AUTHOR_EMAIL": "sglang-backports@localhost",
    "GIT_COMMITTER_NAME": "sglang-backports",
    "GIT_COMMITTER_EMAIL": "sglang-backports@localhost",
}

# Set on every git command: no hook or signing program of the user's runs inside
# our commands, and no setting of theirs changes what `git am` applies.
SAFE_CONFIG = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.autocrlf=false",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "am.threeWay=false",
    "am.keepcr=false",
    "am.messageId=false",
    "apply.whitespace=warn",
]


@dataclass
class Git:
    """Runs git in one work tree.

    owned=True marks a repository this project made: user and system git
    configuration is ignored there, so output (format-patch above all) does
    not depend on whoever runs the command.
    """

    cwd: Path
    owned: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            env.pop(name, None)
        if self.owned:
            env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
            env.update(PROJECT_IDENTITY)
        env.update(self.extra_env)
        return env

    def run(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        config = [arg for item in SAFE_CONFIG for arg in ("-c", item)]
        try:
            # A git cut off half-way can leave a lock file in the repository:
            # an interruption waits for it to end.
            with deferred_signals():
                result = subprocess.run(
                    ["git", *config, *args],
                    cwd=self.cwd,
                    env=self.env(),
                    capture_output=True,
                    text=True,
                    input=input,
                    stdin=None if input is not None else subprocess.DEVNULL,
                    pass_fds=held_fds(),
                )
        except FileNotFoundError as err:
            if not Path(self.cwd).is_dir():
                raise
            raise BackportError(
                Exit.ENVIRONMENT, "git is not installed (not found on PATH)", "install git"
            ) from err
        if check and result.returncode != 0:
            raise GitError(list(args), result)
        return result

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def rev(self, spec: str) -> str | None:
        result = self.run("rev-parse", "--verify", "--quiet", spec, check=False)
        return result.stdout.strip() if result.returncode == 0 else None

    def blob_at(self, rev: str, path: str) -> str | None:
        return self.rev(f"{rev}:{path}")

    def blobs_at(self, rev: str, paths: list[str]) -> dict[str, str | None]:
        """Blob id of each path at rev (None where rev lacks it), in one git call."""
        listing = self.run("ls-tree", "-r", "-z", "--full-tree", rev, "--", *paths).stdout
        found = {}
        for entry in listing.split("\0"):
            if entry:
                meta, path = entry.split("\t", 1)
                found[path] = meta.split()[2]
        return {path: found.get(path) for path in paths}

    @cached_property
    def common_dir(self) -> Path:
        """The repository's own git folder, shared by all its worktrees."""
        return Path(self.out("rev-parse", "--path-format=absolute", "--git-common-dir"))

    def branch_exists(self, branch: str) -> bool:
        return self.rev(f"refs/heads/{branch}") is not None

    def current_branch(self) -> str | None:
        result = self.run("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        return result.stdout.strip() or None

    def dirty_files(self) -> list[str]:
        """Tracked files with staged or unstaged changes (untracked ones are safe)."""
        listing = self.run("status", "--porcelain=v1", "-z", "--untracked-files=no").stdout
        # Each entry is "XY path"; a rename adds its old path as a separate entry.
        entries = iter(listing.split("\0"))
        dirty = []
        for entry in entries:
            if not entry:
                continue
            dirty.append(entry[3:])
            if entry[0] in "RC":
                next(entries, None)
        return dirty

    def operation_in_progress(self) -> str | None:
        git_dir = Path(self.out("rev-parse", "--absolute-git-dir"))
        for marker, name in (
            ("rebase-apply", "git am or rebase"),
            ("rebase-merge", "rebase"),
            ("MERGE_HEAD", "merge"),
            ("CHERRY_PICK_HEAD", "cherry-pick"),
        ):
            if (git_dir / marker).exists():
                return name
        return None


def open_checkout(path: Path) -> Git:
    """A Git for a user's checkout, refusing a path that is not one."""
    if not path.is_dir():
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"{path} is not a directory",
            "pass --sglang with the top folder of a git checkout of sglang",
        )
    git = Git(path)
    result = git.run("rev-parse", "--show-toplevel", check=False)
    if result.returncode != 0 and "dubious ownership" in result.stderr:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"git refuses to work in {path}, which another user owns:\n" + result.stderr.strip(),
            "run the command as the repository's owner, or, if you trust it, allow it "
            f"with `git config --global --add safe.directory {shlex.quote(str(path))}`",
        )
    if result.returncode != 0:
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"{path} is not a git checkout",
            "clone sglang and check out the pinned tag first, e.g. "
            "`git clone https://github.com/sgl-project/sglang && "
            "git -C sglang checkout v0.5.15.post1`, then pass --sglang sglang",
        )
    top = Path(result.stdout.strip())
    if top.resolve() != path.resolve():
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"{path} is inside the git checkout {top}, not its top folder",
            f"pass --sglang {shlex.quote(str(top))}",
        )
    if git.rev("HEAD") is None:
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"the git repository at {path} has no commits",
            "check out sglang's pinned tag there first",
        )
    return git
