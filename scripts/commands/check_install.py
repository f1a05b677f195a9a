"""Say whether an environment's sglang runs the fixed code: no import of sglang needed."""

from __future__ import annotations

import sys
from pathlib import Path

from checkinstall import exposure, install, zipapp
from patchset import catalog as catalogs
from patchset import cli, paths
from patchset.errors import BackportError, Exit
from patchset.manifest import RELEASES_NAME, LaunchSettings, load_releases
from racecheck.catalogue import PLAYS

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

With the deployment's configuration (--launch-args, or --server-info of the
running server; --env for its environment), an affected or partly fixed
install gets a verdict per setting: disaggregation mode, overlap scheduling,
speculative algorithm, device and WAR barrier, hisparse; and exit 25 (this
configuration reaches the race: scenarios and buffers named) or 26 (it does
not: the setting that keeps it out named). The launch arguments are parsed by
the interpreter's own sglang ServerArgs where it imports, else by the
release's [launch] table in patches/releases.toml; the output says which.
--zipapp OUT writes all of this as one file to copy into a pod: python3 OUT
takes the same options. More: docs/check-install.md.
"""

CODES = [
    Exit.PATCHSET_INVALID, Exit.AFFECTED, Exit.PARTIAL_FIX, Exit.UNKNOWN_CONTENT,
    Exit.NOT_INSTALLED, Exit.MODIFIED, Exit.EXPOSED, Exit.NOT_EXPOSED, Exit.AMBIGUOUS,
    Exit.EXPOSURE_UNKNOWN,
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
    Exit.EXPOSED: "affected or partial fix, and this configuration reaches the race "
    "(--launch-args or --server-info; the scenarios and buffers are named)",
    Exit.NOT_EXPOSED: "affected or partial fix, but this configuration does not reach the "
    "race: the setting that keeps it out is named (changing it exposes the deployment)",
    Exit.EXPOSURE_UNKNOWN: "the configuration could not be fully understood (a config file, "
    "an option, a value, or the release to read it by): what was not understood is named, "
    "and the deployment may reach the race",
    Exit.ENVIRONMENT: "--python cannot be run or asked (it crashed, or its answer is not "
    "the JSON this command asks for), a file cannot be read, or --server-info gave no "
    "usable answer (refused, timed out, 401, 404, not JSON)",
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
    config = p.add_mutually_exclusive_group()
    config.add_argument(
        "--launch-args",
        metavar="ARGS",
        help="the deployment's sglang launch arguments, quoted as one string "
        "(as in a Helm chart, compose file or systemd unit)",
    )
    config.add_argument(
        "--server-info",
        metavar="URL",
        help="the running server's /server_info (e.g. http://10.0.0.5:30000/server_info)",
    )
    p.add_argument("--api-key", metavar="KEY", help="the bearer token --server-info sends")
    p.add_argument(
        "--timeout",
        type=cli.seconds,
        metavar="SECONDS",
        help=f"how long --server-info waits for the answer (default {exposure.TIMEOUT_S:g})",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable of the server's environment (e.g. SGLANG_ENABLE_WAR_BARRIER=1); "
        "repeat for more",
    )
    p.add_argument(
        "--torch-build",
        choices=exposure.TORCH_BUILDS,
        help="the server's torch build: rocm on an AMD GPU (sglang names its device cuda "
        "there, but is_cuda() is false, so the WAR barrier is off). Default: what torch "
        "says where --python runs sglang's ServerArgs, else cuda",
    )
    p.add_argument(
        "--zipapp",
        type=cli.absolute_path,
        metavar="OUT",
        help="write check-install, the release data and the manifests as one zipapp "
        "to OUT and stop (run it as python3 OUT [options])",
    )
    args = p.parse_args()
    if args.zipapp:
        digest = zipapp.build_zipapp(paths.PROJECT_ROOT, args.zipapp)
        print(f"wrote {args.zipapp} (sha256 {digest}); run it as python3 {args.zipapp.name}")
        return Exit.OK
    if args.api_key and not args.server_info:
        p.error("--api-key goes with --server-info")
    if args.timeout is not None and not args.server_info:
        p.error("--timeout goes with --server-info")
    env = exposure.parse_env(args.env)
    catalog = catalogs.load_catalog(paths.PATCHES_ROOT)
    python = args.python or Path(sys.executable)
    if args.tree:
        report = install.inspect_tree(args.tree, catalog)
    else:
        report = install.inspect_install(python, catalog)
    print(report.where)
    print(f"distribution: {report.distribution}")
    for state in report.files:
        if state.blob is None:
            print(f"  {state.path}  missing")
            continue
        print(f"  {state.path}  blob {state.blob}  sha256 {state.sha256}  {state.record}")
    code, verdict = report.verdict()
    if code not in (Exit.AFFECTED, Exit.PARTIAL_FIX) or not (args.launch_args or args.server_info):
        if code == Exit.OK and (args.launch_args or args.server_info):
            verdict += "; whatever the configuration"
        print(f"verdict: {verdict}")
        return code
    content = report.matches[0]
    table = load_releases(paths.PATCHES_ROOT / RELEASES_NAME).launch.get(content.release)
    if args.server_info:
        settings = exposure.from_server_info(
            args.server_info, args.api_key, table, args.timeout or exposure.TIMEOUT_S
        )
    else:
        launch = exposure.split_launch_args(args.launch_args)
        needed = _table(table, content.release)
        if args.tree:
            settings = exposure.parse_with_table(
                launch, needed, "--tree: no interpreter here to run sglang's ServerArgs"
            )
        else:
            settings = exposure.parse_with_server_args(python, launch, env, needed)
    settings.env = env
    if args.torch_build:
        settings.torch_build = args.torch_build
        settings.torch_source = f"--torch-build {args.torch_build}"
    result = exposure.judge(settings, dict(content.races), table, verdict, PLAYS)
    print("\n".join(result.lines))
    return result.code


def _table(table: LaunchSettings | None, release: str) -> LaunchSettings:
    if table is None:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f'{paths.PATCHES_ROOT / RELEASES_NAME} has no [launch."{release}"], so the launch '
            "arguments cannot be read for that release",
            "add the table (docs/check-install.md says how it is measured)",
        )
    return table
