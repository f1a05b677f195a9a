"""Show a reviewer the series: each patch, the net diff, and ours beside upstream's fix."""

import sys

from patchreview.render import render_all_html, render_all_text, render_html, render_text
from patchreview.review import build_review, load_notes
from patchset import cli, paths
from patchset.errors import BackportError, Exit
from patchset.manifest import Series, patch_set_folders

DESCRIPTION = """\
Print a review of the patch series:
  - per patch: subject, why (the message body), Upstream-Status / PR / release,
    the files and the functions (def/class) its changed lines fall in, a diffstat;
  - the cumulative diff of the pinned base against the fully patched files;
  - each function the series changes beside upstream's fixed release (0.5.19),
    every difference explained from scripts/patchreview/notes.toml or marked
    UNEXPLAINED; a note that covers nothing is STALE (a note about other bases
    is left out there).
Our files come from the build tree (scripts/apply-patches) when it holds this
series, else from the pinned base wheel with the series applied; the 0.5.19
wheel is downloaded once, sha256-checked, into the shared cache.
"""
CODES = [Exit.PATCHSET_INVALID, Exit.WHEEL_HASH, Exit.WHEEL_UNAVAILABLE, Exit.APPLY_FAILED]
CODES += [Exit.STALE]  # --strict
WORDING = {
    Exit.OK: "the review was written; every difference from upstream is explained",
    Exit.STALE: "(--strict) a difference from upstream has no explanation, or a note is stale",
}


def main() -> int:
    p = cli.parser("review", DESCRIPTION, CODES, WORDING)
    html = "also write it here as one self-contained HTML page, side by side (--all: one page)"
    p.add_argument("--html", type=cli.absolute_path, metavar="FILE", help=html)
    for flag, what in {
        "--strict": "exit 13 when a difference is unexplained or a note is stale (on any base)",
        "--all": "review every patch set under patches/, one section per base and a table at "
        "the end (not with --patch-set)",
        "--brief": "with --all: print only the problems and the table of bases (the cheap form "
        "for CI)",
    }.items():
        p.add_argument(flag, action="store_true", help=what)
    cli.add_patch_set(p)
    p.set_defaults(patch_set=None)  # to tell a --patch-set given from none
    args = p.parse_args()
    if args.all and args.patch_set is not None:
        p.error("--all reviews every patch set under patches/; leave out --patch-set")
    if args.brief and not args.all:
        p.error("--brief goes with --all")
    folders = [args.patch_set or paths.DEFAULT_PATCH_DIR]
    if args.all and not (folders := patch_set_folders(paths.PATCHES_ROOT)):
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"no patch set (sglang-*/pin.toml) under {paths.PATCHES_ROOT}",
            "run from a complete checkout of this project",
        )
    build, cache, notes = paths.build_dir(), paths.cache_dir(), load_notes()  # read once for all
    reviews = [build_review(Series.load(folder), build, cache, notes) for folder in folders]
    sys.stdout.write(render_all_text(reviews, args.brief) if args.all else render_text(reviews[0]))
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        page = render_all_html(reviews) if args.all else render_html(reviews[0])
        args.html.write_text(page, encoding="utf-8")
        print(f"wrote {args.html}")
    if not args.strict or not (failing := [r for r in reviews if not r.ok]):
        return Exit.OK
    return cli.report(  # returned, not raised: a test runs main() and reads the code
        BackportError(
            Exit.STALE,
            f"{sum(r.unexplained for r in failing)} unexplained differences, "
            f"{sum(r.stale for r in failing)} stale notes (marked above; base "
            f"{', '.join(r.base_version for r in failing)})",
            "explain each new difference in scripts/patchreview/notes.toml (or change the "
            "patch), and drop notes that cover nothing",
        )
    )
