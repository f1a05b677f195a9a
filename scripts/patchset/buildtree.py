"""The build tree's conventions (place, tag, branch, step trees) and files_at, the one reader."""

import shutil
from pathlib import Path

from .catalog import Files
from .errors import BackportError, Exit
from .git import Git
from .manifest import PinManifest, Series


def build_tree_path(series: Series, build: Path) -> Path:
    return build / f"sglang-{series.manifest.base.version}"


def pristine_tag(manifest: PinManifest) -> str:
    return f"pristine/{manifest.base.version}"


def default_branch(manifest: PinManifest) -> str:
    return f"sglang-backports/{manifest.base.version}"


def series_commits(git: Git, manifest: PinManifest) -> list[str]:
    range_ = f"{pristine_tag(manifest)}..{default_branch(manifest)}"
    return git.out("rev-list", "--reverse", range_).split()


def files_at(git: Git, rev: str, manifest: PinManifest) -> Files:
    """path (under git.prefix) -> its bytes at rev, or None, in one git call."""
    paths = list(manifest.files)
    asked = "".join(f"{rev}:{git.prefix}{path}\n" for path in paths).encode()
    result = git.run("cat-file", "--batch", input=asked, check=False)
    found: Files = dict.fromkeys(paths)
    if result.returncode != 0:  # rev itself unreadable: no file
        return found
    out = result.stdout
    for path in paths:
        header, _, out = out.partition(b"\n")
        fields = header.split()  # "<oid> <type> <size>" and the bytes, or "<rev:path> missing"
        if len(fields) == 3 and fields[2].isdigit():
            size = int(fields[2])
            found[path], out = (out[:size] if fields[1] == b"blob" else None), out[size + 1 :]
    return found


def step_trees(series: Series, build: Path) -> dict[str, Path]:
    """step -> a detached worktree (ours: pruning is safe) in build/steps/<version>/, reused."""
    manifest = series.manifest
    git = Git(build_tree_path(series, build), owned=True)
    revs = [git.rev(pristine_tag(manifest)) or "", *series_commits(git, manifest)]
    git.run("worktree", "prune")
    trees: dict[str, Path] = {}
    for step, rev in zip(manifest.steps, revs, strict=True):
        tree = build / "steps" / manifest.base.version / step
        if not tree.is_dir() or Git(tree, owned=True).rev("HEAD") != rev:
            if tree.exists():
                git.run("worktree", "remove", "--force", str(tree), check=False)
                shutil.rmtree(tree, ignore_errors=True)
                git.run("worktree", "prune")
            git.run("worktree", "add", "--quiet", "--detach", str(tree), rev)
        trees[step] = tree
    return trees


def check_tree(tree: Path, code: Exit = Exit.SETUP) -> Path:
    tree = tree.resolve()
    if not (tree / "python" / "sglang" / "__init__.py").is_file():
        raise BackportError(
            code,
            f"--tree {tree} holds no python/sglang/__init__.py",
            "pass the folder that contains python/sglang (an sglang checkout, or "
            "build/steps/<release>/<step>)",
        )
    return tree
