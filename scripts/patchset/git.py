"""A thin wrapper over the git command line."""

import os
import shlex
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

from .errors import BackportError, Exit, GitError
from .lock import deferred_signals, held_fds

# Who commits in repositories this project owns (the build tree).
PROJECT_IDENTITY = {
    f"GIT_{who}_{what}": value
    for who in ("AUTHOR", "COMMITTER")
    for what, value in (("NAME", "sglang-backports"), ("EMAIL", "sglang-backports@localhost"))
}
# On every git command: no hook or signing program of the user's runs; our temporary
# index is never split (that writes sharedindex.* into the git folder) nor sparse.
SAFE_CONFIG = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.autocrlf=false",
    "core.splitIndex=false",
    "index.sparse=false",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "apply.whitespace=warn",
]
SGLANG_PACKAGE = "python/sglang"  # what the top folder of sglang's source holds
# The only GIT_* variables of the caller's that reach git (who commits, and when): any
# other may point git at other objects, alternates, index or config.
KEPT_GIT_ENV = {*PROJECT_IDENTITY, "GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"}


@dataclass
class Git:
    """git in one work tree; owned: ours, so the user's and system's config are ignored."""

    cwd: Path
    owned: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    prefix: str = ""  # where sglang's top folder is in the repository: "" or "vendored/"

    def run(
        self, *args: str, check: bool = True, input: str | bytes | None = None
    ) -> subprocess.CompletedProcess[Any]:
        """git args; given bytes (file contents), its output is bytes too."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in KEPT_GIT_ENV}
        env["GIT_OPTIONAL_LOCKS"] = "0"  # no git of ours writes what it may skip
        if self.owned:
            env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **PROJECT_IDENTITY)
        config = [arg for item in SAFE_CONFIG for arg in ("-c", item)]
        try:
            # A git cut off half-way can leave a lock file: an interruption waits for it.
            with deferred_signals():
                result = subprocess.run(
                    ["git", *config, *args],
                    cwd=self.cwd,
                    env=env | self.extra_env,
                    capture_output=True,
                    text=not isinstance(input, bytes),
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

    def with_env(self, env: dict[str, str]) -> Self:
        return replace(self, extra_env=self.extra_env | env)

    def rev(self, spec: str) -> str | None:
        result = self.run("rev-parse", "--verify", "--quiet", spec, check=False)
        return result.stdout.strip() if result.returncode == 0 else None

    def branch_exists(self, branch: str) -> bool:
        return self.rev(f"refs/heads/{branch}") is not None

    def overriding(self, section: str, var: str, values: dict[str, str]) -> tuple[Self, list[str]]:
        """This git with section.NAME.KEY=value for each configured NAME (that sets var), and
        the NAMEs: set through the environment, as a NAME may hold "=", unlike with -c."""
        keys = self.run(
            "config", "-z", "--name-only", "--get-regexp", rf"^{section}\..*\.{var}$", check=False
        ).stdout.split("\0")
        names = sorted({key.split(".", 1)[1].rsplit(".", 1)[0] for key in keys if key})
        pairs = [(f"{section}.{n}.{k}", v) for n in names for k, v in values.items()]
        env = {"GIT_CONFIG_COUNT": str(len(pairs))}
        for n, (key, value) in enumerate(pairs):
            env |= {f"GIT_CONFIG_KEY_{n}": key, f"GIT_CONFIG_VALUE_{n}": value}
        return self.with_env(env), names


def open_checkout(path: Path) -> Git:
    """A Git for the folder of a user's checkout that holds python/sglang; else a refusal."""
    if not path.is_dir():
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"{path} is not a directory",
            "pass --sglang with the top folder of a git checkout of sglang",
        )
    result = Git(path).run("rev-parse", "--show-toplevel", check=False)
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
    top, here = Path(result.stdout.strip()).resolve(), path.resolve()
    if not (here / SGLANG_PACKAGE).is_dir():
        raise _where_sglang_is(path, here, top)
    git = Git(top, prefix="" if here == top else here.relative_to(top).as_posix() + "/")
    if git.rev("HEAD") is None:
        raise BackportError(
            Exit.NOT_A_CHECKOUT,
            f"the git repository at {path} has no commits",
            "check out sglang's pinned tag there first",
        )
    return git


def _where_sglang_is(path: Path, here: Path, top: Path) -> BackportError:
    up = [f for f in [here, *here.parents] if f == top or top in f.parents]
    down = [f.parents[1] for d in ("*", "*/*") for f in sorted(here.glob(f"{d}/{SGLANG_PACKAGE}"))]
    found = [f for f in [*up, *down] if (f / SGLANG_PACKAGE).is_dir()]
    problem = f"{path} holds no {SGLANG_PACKAGE}"
    next_step = (
        "pass --sglang with the folder of your git checkout that holds python/sglang "
        "(sglang's own top folder, or where your repository vendors it)"
    )
    if len(found) == 1:
        problem += f"; sglang's top folder in this repository is {found[0]}"
        next_step = f"pass --sglang {shlex.quote(str(found[0]))}"
    elif found:
        problem += f"; these folders of the repository {top} do: {', '.join(map(str, found))}"
    return BackportError(Exit.NOT_A_CHECKOUT, problem, next_step)
