"""Say whether an environment's sglang runs the fixed code: no import of sglang needed."""

import sys

from checkinstall import check, exposure, report, zipapp
from patchset import cli
from patchset.errors import BackportError, Exit

DESCRIPTION = """\
Find the sglang an interpreter would import (find_spec only: sglang is not
imported, no GPU needed), hash its three files (git blob id, sha256) and name
them from patches/: unpatched, fix A only, a series of ours, fixed upstream,
else judged by code shape. Each file is checked against its distribution's
RECORD (editable: where its hooks put the files; no RECORD: by content alone);
two distributions that install sglang are refused. Standard library only
(Python 3.10+): copy scripts/ and patches/ into a container, or use --zipapp.

When several verdicts hold, the first decides: not installed; two
distributions; a race open (race-check's scenarios, per pin.toml's [races]);
files that differ from RECORD; unknown content. Given the deployment's
configuration (--launch-args, read by the interpreter's own ServerArgs, else
by the release's [launch] profile, --config merged as sglang merges it; or
--server-info; --env), an affected install gets a verdict per setting and
exit 25, 26 or 28: content no release has is never "not exposed". More:
docs/check-install.md.
"""

# check-install's own words where errors.EXIT_TEXT's general ones say less
WORDING = {
    Exit.OK: "the race is closed: a series of ours applied, or sglang 0.5.19 or later",
    Exit.PARTIAL_FIX: "fix A only (0.5.16 to 0.5.18, or a partly applied series): races open",
    Exit.NOT_INSTALLED: "that interpreter (or --tree) has no sglang",
    Exit.MODIFIED: "the race is closed or the content unknown, but the files differ from "
    "the installed distribution's RECORD (an in-place edit pip does not know of)",
    Exit.AMBIGUOUS: "two or more distributions that install sglang on that interpreter's "
    "path (they are named, a fork too): remove all but one",
    Exit.EXPOSURE_UNKNOWN: "the configuration could not be fully understood (a config file, "
    "an option, a value, or the release to read it by): what was not understood is named, "
    "and the deployment may reach the race",
    Exit.ENVIRONMENT: "--python cannot be run or asked (it crashed, or its answer is not "
    "the JSON this command asks for), a file cannot be read, or --server-info gave no "
    "usable answer (refused, timed out, 401, 404, not JSON)",
}
CODES = [*WORDING, Exit.PATCHSET_INVALID, Exit.AFFECTED, Exit.UNKNOWN_CONTENT, Exit.AMBIGUOUS]
CODES += [Exit.EXPOSED, Exit.NOT_EXPOSED, Exit.EXPOSURE_UNKNOWN]
HELP = {
    "--python": "the interpreter that runs sglang (default: this one)",
    "--tree": "judge the files of DIR/sglang or DIR/python/sglang instead (no RECORD)",
    "--launch-args": "the deployment's sglang launch arguments as one quoted string (as a Helm "
    "chart, compose file or systemd unit has them)",
    "--server-info": "the running server's /server_info (e.g. http://10.0.0.5:30000/server_info)",
    "--config": "the server's --config YAML file, as copied here (it stands for the one "
    "--launch-args names, or is added to them); read as the release reads it",
    "--config-root": "the server's working folder, as copied here: for a relative --config path",
    "--api-key": "the bearer token --server-info sends",
    "--timeout": f"how long --server-info waits for the answer (default {exposure.TIMEOUT_S:g})",
    "--env": "a variable of the server's environment, e.g. SGLANG_ENABLE_WAR_BARRIER=1 (repeat)",
    "--torch-build": "the server's torch build: rocm on an AMD GPU (is_cuda() is false there: "
    "no WAR barrier). Default: what torch says where --python runs ServerArgs, else cuda",
    "--format": "text (default), or json: one JSON object, a refusal's too, same exit codes "
    "(docs/check-install.md lists its keys)",
    "--zipapp": "write check-install and the release data as one zipapp to OUT (a regular file, "
    "or - for standard output) and stop; python3 OUT [options] runs it, writing nothing",
}


def main() -> int:
    p = cli.parser("check-install", DESCRIPTION, CODES, WORDING)
    which, config = p.add_mutually_exclusive_group(), p.add_mutually_exclusive_group()
    absolute = cli.absolute_path
    path = {"type": absolute}
    for group, flag, how in (
        (which, "--python", path | {"metavar": "PY"}),
        (which, "--tree", path | {"metavar": "DIR"}),
        (config, "--launch-args", {"metavar": "ARGS"}),
        (config, "--server-info", {"metavar": "URL"}),
        (p, "--config", path | {"metavar": "FILE"}),
        (p, "--config-root", path | {"metavar": "DIR"}),
        (p, "--api-key", {"metavar": "KEY"}),
        (p, "--timeout", {"type": cli.seconds, "metavar": "SECONDS"}),
        (p, "--env", {"action": "append", "default": [], "metavar": "NAME=VALUE"}),
        (p, "--torch-build", {"choices": ("cuda", "rocm")}),
        (p, "--format", {"choices": ("text", "json"), "default": "text"}),
        (p, "--zipapp", {"type": lambda t: t if t == "-" else absolute(t), "metavar": "OUT"}),
    ):
        group.add_argument(flag, help=HELP[flag], **how)
    args = p.parse_args()
    if args.zipapp:
        print(zipapp.write_zipapp(None if args.zipapp == "-" else args.zipapp), file=sys.stderr)
        return Exit.OK
    for flag, given in (("--api-key", args.api_key), ("--timeout", args.timeout is not None)):
        if given and not args.server_info:
            p.error(f"{flag} goes with --server-info")
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
        return cli.report(err)
    wants_json = args.format == "json"
    sys.stdout.write(report.dump(report.as_json(outcome)) if wants_json else report.text(outcome))
    return outcome.code
