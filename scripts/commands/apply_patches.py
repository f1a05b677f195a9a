"""Apply the PD-decode prebuilt race backports to sglang."""

import argparse
import shlex
from functools import partial
from pathlib import Path

from patchset import apply, buildtree, catalog, cli, paths, threeway
from patchset import wheel as wheels
from patchset.errors import Exit
from patchset.git import Git, open_checkout
from patchset.lock import DEFAULT_WAIT_S
from patchset.manifest import Series, series_for_release

DESCRIPTION = """\
Apply the series under patches/ to sglang, on a branch of its own.

With no arguments: the default release's pinned, sha256-checked wheel (--base
VERSION: another served release) laid out as a git tree under build/, its base
tagged pristine. With --sglang PATH (the folder of your checkout that holds
python/sglang): the served release recognised by the files the series touch;
your branch, index and work tree stay as they are and no hook or filter program
of yours runs. A second run says "already applied" (exit 0).

With --sglang PATH --3way, for a fork: the preimages go into your repository as
unreferenced loose objects; the branch is made only if nothing conflicts and the
result is judged "fixed" by its code shape, else exit 10 and nothing of yours
changes. The run names your fork's changes to the functions the series changes,
and `scripts/race-check --tree PATH` as the next step (docs/apply.md).

One run at a time per build folder or repository (a second waits, --wait, then
exits 19 naming the first); Ctrl-C or a kill leaves nothing half-made that the
next run does not remove.
"""

WORDING = {
    Exit.OK: "applied, already applied, or (--check) every patch applies cleanly",
    Exit.APPLY_FAILED: "a patch failed to apply, or (--3way) conflicts with your fork or "
    "merges into code not judged fixed; nothing of yours was changed",
    Exit.BASE_MISMATCH: "the base's files match no release this project serves (with --3way: "
    "no file of a served release, so --base must name it)",
    Exit.ALREADY_UPSTREAM: "the base already contains the fixes (sglang 0.5.19 or later), or its "
    "code is judged fixed by its shape: no patch is needed",
    Exit.NOT_A_CHECKOUT: "the path is not in a git checkout, or holds no python/sglang (the "
    "folder that does is named), or a build tree this command did not make",
    Exit.BRANCH_EXISTS: "the target branch already exists and holds something else, or a "
    "ref is in the way of its name: pass --branch",
}
CODES = [*WORDING, Exit.DIRTY_TREE, Exit.PATCHSET_INVALID, Exit.WHEEL_HASH, Exit.WHEEL_UNAVAILABLE]
CODES += [Exit.WOULD_NOT_APPLY, Exit.LOCKED]
HELP = {
    "--sglang": "the folder of your git checkout that holds python/sglang",
    "--check": "say per patch whether it would apply cleanly; change nothing",
    "--branch": "branch to create (default: sglang-backports/VERSION)",
    "--wait": f"how long to wait for another run on the same target (default {DEFAULT_WAIT_S:g})",
    "--base": f"the sglang release to lay out (default {paths.DEFAULT_BASE}); with --sglang, the "
    "release is recognised from the checkout (with --3way: the release it is a fork of)",
    "--patch-set": "use this patch set folder instead of the one that serves the release",
    "--3way": "with --sglang, for a fork: apply the nearest served release's series (or "
    "--base VERSION's) with git's three-way merge; kept only if judged fixed",
}


def branch_name(name: str) -> str:
    if name.startswith("refs/"):
        problem = "give the branch name without refs/ (e.g. refs/heads/x is x)"
    else:
        check = Git(Path("/")).run("check-ref-format", "--branch", name, check=False)
        if check.returncode == 0 and check.stdout.strip() == name:
            return name
        problem = "not a valid git branch name (see `git check-ref-format --help`)"
    raise argparse.ArgumentTypeError(f"{name!r}: {problem}")


def check(args: argparse.Namespace, series: Series | None) -> int:
    given = catalog.reading(series)  # with --sglang alone, the default: it names the files to read
    if not args.sglang:
        apply.verify(given)
    where = args.sglang or buildtree.build_tree_path(given, paths.build_dir())
    if args.sglang or where.is_dir():
        files = buildtree.files_at(open_checkout(where), "HEAD", given.manifest)
    else:  # no build tree yet: the pinned wheel's files
        where = wheels.fetch_wheel(given.manifest.base, paths.cache_dir())
        files = dict(wheels.read_files(where, given.manifest.files))
    found, step = catalog.recognise(files, str(where), series, bool(args.sglang))
    if args.sglang or found is not series:  # the build tree's series is verified above
        apply.verify(found)
    results = apply.check_series(found, step, files)
    print(f"checking {len(results)} patches against {where}")
    for name, status in results.items():
        print(f"  {name}: " + status.replace("\n", "\n    "))
    failed = any(status.startswith(apply.FAILS) for status in results.values())
    return Exit.WOULD_NOT_APPLY if failed else Exit.OK


def main() -> int:
    p = cli.parser("apply-patches", DESCRIPTION, CODES, WORDING)
    p.add_argument("--sglang", type=cli.absolute_path, metavar="PATH", help=HELP["--sglang"])
    p.add_argument("--check", action="store_true", help=HELP["--check"])
    p.add_argument("--branch", type=branch_name, help=HELP["--branch"])
    p.add_argument(
        "--wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS", help=HELP["--wait"]
    )
    p.add_argument("--base", metavar="VERSION", help=HELP["--base"])
    p.add_argument("--patch-set", type=cli.absolute_path, metavar="DIR", help=HELP["--patch-set"])
    p.add_argument("--3way", dest="three_way", action="store_true", help=HELP["--3way"])
    args = p.parse_args()
    refused = {
        "--base picks a patch set; give either --base or --patch-set": args.base and args.patch_set,
        "--3way is for a fork: it needs --sglang PATH (the build tree is a release)": (
            args.three_way and not args.sglang
        ),
        "--3way cannot be combined with --check: --3way itself changes nothing unless the "
        "merge is clean and judged fixed": args.three_way and args.check,
        "--base is for the build tree; with --sglang the release is recognised (with --3way, "
        "--base names the release a fork is of)": args.base and args.sglang and not args.three_way,
        "--branch needs --sglang; the build tree always uses the default branch": (
            args.branch is not None and not args.sglang
        ),
    }
    for message in (message for message, bad in refused.items() if bad):
        p.error(message)
    series = None  # with --sglang and no --patch-set: recognised from the checkout
    if args.patch_set:
        series = Series.load(args.patch_set)
    elif not args.sglang:
        series = series_for_release(paths.PATCHES_ROOT, args.base or paths.DEFAULT_BASE)
    if args.check:
        return check(args, series)

    if args.sglang:
        fork = partial(threeway.onto_fork, args.sglang, args.branch, series, args.base)
        report = apply.apply_to_user_checkout(
            args.sglang, args.branch, args.wait, series, fork if args.three_way else None
        )
    else:
        assert series is not None
        report = apply.apply_to_build_tree(series, paths.build_dir(), paths.cache_dir(), args.wait)

    if not report.applied:
        holder = f"branch {report.branch}" if report.branch else "its checked-out HEAD"
        n = len(report.already)
        print(f"already applied: {report.where} ({holder}) has all {n} patches; nothing to do")
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
        assert series is not None
        print(
            f"patched tree: {report.where / 'python'} (branch {report.branch}, "
            f"pristine base tagged {buildtree.pristine_tag(series.manifest)})"
        )
    for line in report.notes:
        print(line)
    return Exit.OK
