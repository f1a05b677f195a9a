"""Say whether an environment's sglang runs the fixed code: no import of sglang needed."""

from __future__ import annotations

import sys
from pathlib import Path

from checkinstall import check, exposure, report, zipapp
from patchset import cli, paths
from patchset.errors import BackportError, Exit

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
module names; a distribution without RECORD is judged by content alone. The
distribution is found by the files it owns, whatever its name (a fork named
otherwise is named as a fork); two that install sglang on the path are
refused: which one pip sees depends on the order of sys.path. Needs only
Python 3.10's standard library: copy scripts/ and patches/ into a container
and run scripts/check-install with the container's python, or use --zipapp.

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
configuration reaches the race: scenarios and buffers named), 26 (it does
not: the setting that keeps it out named) or 28 (something in it is not
understood, and named: never taken as safe). Content no release has is never
"not exposed": judged as the release its distribution's version names (25),
else exposure unknown (28). The launch arguments are parsed by the
interpreter's own sglang ServerArgs where it imports, else by the release's
[launch] profile in patches/releases.toml, with a --config YAML file merged as
sglang merges it; the output says which.
--zipapp OUT writes all of this as one file to copy into a pod: python3 OUT
takes the same options and runs from the archive, nothing written. --format
json prints one JSON object instead of the text (also for a refusal), with
the same exit codes. More: docs/check-install.md.
"""

WORDING = {
    Exit.OK: "the race is closed: a series of ours applied, or sglang 0.5.19 or later",
    Exit.AFFECTED: "affected: an unpatched sglang, every race open",
    Exit.PARTIAL_FIX: "fix A only (0.5.16 to 0.5.18, or a partly applied series): races open",
    Exit.UNKNOWN_CONTENT: "the files match no release and no series this project knows",
    Exit.NOT_INSTALLED: "that interpreter (or --tree) has no sglang",
    Exit.MODIFIED: "the race is closed or the content unknown, but the files differ from "
    "the installed distribution's RECORD (an in-place edit pip does not know of)",
    Exit.AMBIGUOUS: "two or more distributions that install sglang on that interpreter's "
    "path (they are named, a fork too): remove all but one",
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
# every code worded above, and a patch set whose data cannot be read
CODES = [Exit.PATCHSET_INVALID, *WORDING]


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
    p.add_argument(
        "--config",
        type=cli.absolute_path,
        metavar="FILE",
        help="the server's --config YAML file, as copied here (it stands for the one "
        "--launch-args names, or is added to them); read as the release reads it",
    )
    p.add_argument(
        "--config-root",
        type=cli.absolute_path,
        metavar="DIR",
        help="the server's working folder, as copied here: a relative --config path in "
        "--launch-args is read from there",
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
        "--format",
        choices=report.FORMATS,
        default="text",
        help="text (default), or json: one JSON object on standard output, also for a "
        "refusal (docs/check-install.md lists its keys); the exit codes are the same",
    )
    p.add_argument(
        "--zipapp",
        type=_zipapp_out,
        metavar="OUT",
        help="write check-install, the release data and the manifests as one zipapp "
        "to OUT (a regular file, or - for standard output) and stop (run it as "
        "python3 OUT [options]; it needs nothing writable)",
    )
    args = p.parse_args()
    if args.zipapp:
        out = None if args.zipapp == "-" else args.zipapp
        digest = zipapp.write_zipapp(zipapp.build_zipapp(paths.PROJECT_ROOT), out)
        where = f"wrote {out}" if out else "wrote the zipapp to standard output"
        name = out.name if out else "check-install.pyz"
        print(f"{where} (sha256 {digest}); run it as python3 {name}", file=sys.stderr)
        return Exit.OK
    if args.api_key and not args.server_info:
        p.error("--api-key goes with --server-info")
    if args.timeout is not None and not args.server_info:
        p.error("--timeout goes with --server-info")
    if args.server_info and (args.config or args.config_root):
        p.error("--config and --config-root go with --launch-args, not --server-info")
    if args.config_root and args.launch_args is None:
        p.error("--config-root goes with --launch-args")
    try:
        outcome = check.check(args)
    except (BackportError, OSError) as caught:
        if args.format != "json":
            raise
        err = caught if isinstance(caught, BackportError) else cli.describe_os_error(caught)
        sys.stdout.write(report.dump(report.error_json(err)))
        print(f"error: {err}", file=sys.stderr)
        return err.code
    if args.format == "json":
        sys.stdout.write(report.dump(report.as_json(outcome)))
    else:
        sys.stdout.write(report.text(outcome))
    return outcome.code


def _zipapp_out(text: str) -> Path | str:
    """argparse type for --zipapp: - (standard output) or an absolute path."""
    return text if text == "-" else cli.absolute_path(text)
