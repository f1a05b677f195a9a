"""Regenerate the patch series from the patched branch of the build tree."""

import sys

from patchset import cli, export, paths
from patchset.errors import BackportError, Exit
from patchset.manifest import Series

DESCRIPTION = """\
Write the series, its patch files and the manifest's [patches] and [blobs]
from the commits pristine..sglang-backports/VERSION of the build tree (made by
scripts/apply-patches), with flags that make the output byte-stable.
With --check: change nothing; exit 13 and show the difference when the
committed patch set is not what a fresh export gives.
"""

CODES = [Exit.PATCHSET_INVALID, Exit.NOT_A_CHECKOUT, Exit.STALE]
WORDING = {
    Exit.OK: "exported, or (--check) the committed patch set is current",
    Exit.NOT_A_CHECKOUT: "there is no patched build tree to export from",
    Exit.STALE: "(--check) the committed patch set differs from a fresh export",
}


def main() -> int:
    p = cli.parser("export-patches", DESCRIPTION, CODES, WORDING)
    p.add_argument("--check", action="store_true", help="only report stale patches")
    cli.add_patch_set(p)
    args = p.parse_args()
    series = Series.load(args.patch_set)
    if args.check:
        if diff := export.stale_diff(series, paths.build_dir()):
            sys.stdout.write(diff)
            raise BackportError(
                Exit.STALE,
                f"the patch set in {series.folder} is stale (diff above)",
                "run scripts/export-patches and commit the result",
            )
        print(f"up to date: {series.folder} matches a fresh export")
        return Exit.OK
    names = export.export_in_place(series, paths.build_dir())
    print(f"exported {len(names)} patches to {series.folder}: {', '.join(names)}")
    return Exit.OK
