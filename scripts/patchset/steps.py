"""The tree at each step of the series, laid out for importing sglang from it."""

from __future__ import annotations

import shutil
from pathlib import Path

from .apply import build_tree_path, pristine_tag, series_commits
from .git import Git
from .manifest import Series


def step_revisions(series: Series, repo: Path) -> dict[str, str]:
    """step name -> commit in the build tree: 'base', then one per patch."""
    git = Git(repo, owned=True)
    manifest = series.manifest
    revs = series_commits(git, manifest)
    return dict(zip(manifest.steps, [git.rev(pristine_tag(manifest)) or "", *revs], strict=True))


def step_trees(series: Series, build: Path) -> dict[str, Path]:
    """step -> folder whose python/ holds that step's sglang package.

    The build tree must already be patched (scripts/apply-patches). Each step is
    a detached git worktree of it under build/steps/, reused while its commit
    is unchanged.
    """
    repo = build_tree_path(series, build)
    git = Git(repo, owned=True)
    root = build / "steps"
    # Forget step worktrees whose folders someone deleted, so they can be made again.
    git.run("worktree", "prune")
    trees: dict[str, Path] = {}
    for step, rev in step_revisions(series, repo).items():
        tree = root / step
        if tree.is_dir() and Git(tree, owned=True).rev("HEAD") == rev:
            trees[step] = tree
            continue
        if tree.exists():
            git.run("worktree", "remove", "--force", str(tree), check=False)
            shutil.rmtree(tree, ignore_errors=True)
            git.run("worktree", "prune")
        git.run("worktree", "add", "--quiet", "--detach", str(tree), rev)
        trees[step] = tree
    return trees
