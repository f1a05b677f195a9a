"""Say whether an environment's sglang runs the fixed code: no import of sglang needed."""

from __future__ import annotations

import sys
from pathlib import Path

from patchset import cli, deploy, paths
from patchset.errors import Exit

DESCRIPTION = """\
Find the sglang that an interpreter would import (importlib.util.find_spec
only: sglang itself is not imported, so no GPU is needed), hash its three
files (git blob id and sha256), and name what they are from every manifest
under patches/: an unpatched base (which races are open), fix A only (0.5.16
to 0.5.18, or a partly applied series), a series of ours applied, fixed
upstream (0.5.19 or later), or unknown content. Each file is also checked
against the installed distribution's RECORD; an editable install (pip install
-e: direct_url.json says dir_info.editable) lists only its hooks there, so its
files are judged by their content, in the folder its .pth file or finder
module names. Two distributions named sglang on the path are refused: which
one pip sees depends on the order of sys.path. Needs only Python 3.11's
standard library: copy scripts/ and patches/ into a container and run
scripts/check-install with the container's python.

The races named are scripts/race-check's scenarios (its --help says what
each plays); which of them each step of each series leaves open is the
[races] table of its pin.toml, written from a run by race-check
--write-expected, and a release not served here leaves open those of a step
that holds the same fixes (patches/releases.toml).

When several verdicts hold, the first in this order decides the exit code:
not installed; two distributions; a race open (affected, partial fix), whether
or not pip knows the files; files that differ from RECORD; unknown content.
Exit 0 only when the race is closed and the files match RECORD (or belong to an
editable install, or no distribution owns them).
"""

CODES = [
    Exit.PATCHSET_INVALID, Exit.AFFECTED, Exit.PARTIAL_FIX, Exit.UNKNOWN_CONTENT,
    Exit.NOT_INSTALLED, Exit.MODIFIED, Exit.AMBIGUOUS,
]  # fmt: skip
WORDING = {
    Exit.OK: "the race is closed: a series of ours applied, or sglang 0.5.19 or later",
    Exit.AFFECTED: "affected: an unpatched sglang, every race open",
    Exit.PARTIAL_FIX: "fix A only (0.5.16 to 0.5.18, or a partly applied series): races open",
    Exit.UNKNOWN_CONTENT: "the files match no release and no series this project knows",
    Exit.NOT_INSTALLED: "that interpreter (or --tree) has no sglang",
    Exit.MODIFIED: "the race is closed or the content unknown, but the files differ from "
    "the installed distribution's RECORD (an in-place edit pip does not know of)",
    Exit.AMBIGUOUS: "two or more distributions named sglang on that interpreter's path "
    "(they are named): remove all but one",
    Exit.ENVIRONMENT: "--python cannot be run or asked (it crashed, or its answer is not "
    "the JSON this command asks for), or a file cannot be read",
}


def main() -> int:
    p = cli.parser("check-install", DESCRIPTION, CODES, WORDING)
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--python",
        type=cli.absolute_path,
        metavar="PY",
        help="the interpreter that runs sglang (default: this one)",
    )
    which.add_argument(
        "--tree",
        type=cli.absolute_path,
        metavar="DIR",
        help="judge the files of DIR/sglang or DIR/python/sglang instead (no RECORD)",
    )
    args = p.parse_args()
    catalog = deploy.load_catalog(paths.PATCHES_ROOT)
    if args.tree:
        report = deploy.inspect_tree(args.tree, catalog)
    else:
        report = deploy.inspect_install(args.python or Path(sys.executable), catalog)
    print(report.where)
    print(f"distribution: {report.distribution}")
    for state in report.files:
        if state.blob is None:
            print(f"  {state.path}  missing")
            continue
        print(f"  {state.path}  blob {state.blob}  sha256 {state.sha256}  {state.record}")
    code, verdict = report.verdict()
    print(f"verdict: {verdict}")
    return code
