"""Apply the PD-decode prebuilt race backports to sglang."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from patchset import apply, buildtree, cli, paths, recognise
from patchset.errors import Exit
from patchset.git import Git, open_checkout
from patchset.lock import DEFAULT_WAIT_S
from patchset.manifest import PinManifest, Series, series_for_release

DESCRIPTION = """\
Apply the series under patches/ to sglang.

With no arguments: download the pinned sglang wheel of the default release
(--base VERSION for another served release; sha256-checked, cached), lay its
sglang/ tree out as python/sglang/ in a git repository under build/, commit and
tag it as the pristine base, and apply that release's series on a branch.
With --sglang PATH (the folder of your git checkout that holds python/sglang:
its top, or where your repository vendors sglang): recognise which served
release it holds (by the content of the files the series touch, in a sha1 or
sha256 repository) and apply that release's series on a new branch; your
current branch, index and work tree are left alone, and no hook or filter
program of yours runs.
A second run says "already applied" and exits 0.

One run at a time per build folder or repository: a second one waits (--wait)
and then refuses with exit 19, naming the first. The build tree is made aside
and renamed into place whole. Ctrl-C or a kill leaves nothing half-made that
the next run does not remove itself; your own branches, worktrees and hooks are
never touched or run.
"""

CODES = [
    Exit.DIRTY_TREE, Exit.BASE_MISMATCH, Exit.ALREADY_UPSTREAM, Exit.PATCHSET_INVALID,
    Exit.NOT_A_CHECKOUT, Exit.WHEEL_HASH, Exit.WHEEL_UNAVAILABLE, Exit.APPLY_FAILED,
    Exit.WOULD_NOT_APPLY, Exit.BRANCH_EXISTS, Exit.LOCKED,
]  # fmt: skip
WORDING = {
    Exit.OK: "applied, already applied, or (--check) every patch applies cleanly",
    Exit.NOT_A_CHECKOUT: "the path is not in a git checkout, or holds no python/sglang (the "
    "folder that does is named), or a build tree this command did not make",
    Exit.BRANCH_EXISTS: "the target branch already exists and holds something else, or a "
    "ref is in the way of its name: pass --branch",
}


def branch_name_problem(name: str) -> str | None:
    """Why name cannot be the new branch's name, or None."""
    if name.startswith("refs/"):
        return "give the branch name without refs/ (e.g. refs/heads/x is x)"
    check = Git(Path("/")).run("check-ref-format", "--branch", name, check=False)
    if check.returncode != 0 or check.stdout.strip() != name:
        return "not a valid git branch name (see `git check-ref-format --help`)"
    return None


def choose_series(args: argparse.Namespace) -> Series:
    """The patch set to apply: named, recognised from the checkout, or the release's."""
    if args.patch_set:
        return Series.load(args.patch_set)
    if args.sglang:
        files = buildtree.files_at(open_checkout(args.sglang), "HEAD", default_manifest())
        return recognise.identify_series(paths.PATCHES_ROOT, files, str(args.sglang))
    return series_for_release(paths.PATCHES_ROOT, args.base or paths.DEFAULT_BASE)


def default_manifest() -> PinManifest:
    return Series.load(paths.DEFAULT_PATCH_DIR).manifest


def main() -> int:
    p = cli.parser("apply-patches", DESCRIPTION, CODES, WORDING)
    p.add_argument(
        "--sglang",
        type=cli.absolute_path,
        metavar="PATH",
        help="the folder of your git checkout that holds python/sglang",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="say per patch whether it would apply cleanly; change nothing",
    )
    p.add_argument("--branch", help="branch to create (default: sglang-backports/VERSION)")
    p.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for another run on the same target (default {DEFAULT_WAIT_S:g})",
    )
    p.add_argument(
        "--base",
        metavar="VERSION",
        help=f"the sglang release to lay out (default {paths.DEFAULT_BASE}); with --sglang, "
        "the release is recognised from the checkout",
    )
    p.add_argument(
        "--patch-set",
        type=cli.absolute_path,
        metavar="DIR",
        help="use this patch set folder instead of the one that serves the release",
    )
    args = p.parse_args()
    if args.base and args.patch_set:
        p.error("--base picks a patch set; give either --base or --patch-set")
    if args.base and args.sglang:
        p.error("--base is for the build tree; with --sglang the release is recognised")
    if args.branch is not None and not args.sglang:
        p.error("--branch needs --sglang; the build tree always uses the default branch")
    if args.branch is not None:
        problem = branch_name_problem(args.branch)
        if problem:
            p.error(f"--branch {args.branch!r}: {problem}")
    series = choose_series(args)

    if args.check:
        apply.verify(series)
        if args.sglang:
            files, where = buildtree.files_of_checkout(series, args.sglang), str(args.sglang)
        else:
            files, where = buildtree.files_of_build_tree(
                series, paths.build_dir(), paths.cache_dir()
            )
        results = apply.check_series(series, files, where)
        print(f"checking {len(results)} patches against {where}")
        for result in results:
            print(f"  {result.patch}: {result.status}")
            if result.detail:
                print("    " + result.detail.replace("\n", "\n    "))
        return Exit.OK if all(r.ok for r in results) else Exit.WOULD_NOT_APPLY

    if args.sglang:
        report = apply.apply_to_user_checkout(series, args.sglang, args.branch, args.wait)
    else:
        report = apply.apply_to_build_tree(series, paths.build_dir(), paths.cache_dir(), args.wait)

    if report.already_applied:
        holder = f"branch {report.branch}" if report.branch else "its checked-out HEAD"
        print(
            f"already applied: {report.where} ({holder}) has all "
            f"{len(series.patch_names)} patches; nothing to do"
        )
        return Exit.OK
    for name in report.already:
        print(f"  already in the base: {name}")
    for name in report.applied:
        print(f"  applied: {name}")
    if args.sglang:
        switch = shlex.join(["git", "-C", str(report.where), "switch", report.branch or ""])
        print(
            f"patched branch {report.branch} created in {report.where}; your current "
            f"branch is unchanged (`{switch}` to use it)"
        )
    else:
        print(
            f"patched tree: {report.where / 'python'} (branch {report.branch}, "
            f"pristine base tagged {buildtree.pristine_tag(series.manifest)})"
        )
    return Exit.OK
