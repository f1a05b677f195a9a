"""check-install's flow: the install judged, and with a configuration its exposure."""

import sys
from argparse import Namespace
from pathlib import Path

from patchset import catalog as catalogs
from patchset.errors import BackportError, Exit
from patchset.releases import RELEASES_NAME, LaunchSettings, load_releases, release_key

from checkinstall import exposure, install, launchargs, report, serverargs, zipapp


def check(args: Namespace) -> report.Outcome:
    args.env = launchargs.parse_env(args.env)  # NAME=VALUE words -> the server's environment
    args.python = args.python or Path(sys.executable)
    catalog = catalogs.load_catalog(zipapp.data_root())
    inspect = install.inspect_tree if args.tree else install.inspect_install
    found = inspect(args.tree or args.python, catalog)
    code, verdict = found.verdict()
    configured = args.launch_args is not None or args.config or args.server_info
    known = bool(found.matches) or found.settled_by_shape
    if not configured or (known and code not in (Exit.AFFECTED, Exit.PARTIAL_FIX)):
        if code == Exit.OK and configured:
            verdict += "; whatever the configuration"
        return report.Outcome(found, code, verdict)
    registry = load_releases(zipapp.data_root() / RELEASES_NAME)
    # files no blob id names, never "not exposed": judged with the races of known content with
    # the shape's fixes, else of the release their distribution's version names, as shipped
    content, assumed = found.content, verdict
    version = found.dist.release if found.dist else ""
    if content is None and (shipped := registry.known.get(version)):
        content = next((c for c in catalog.lookup(dict(shipped.blobs)) if not c.ours), None)
        assumed = f"{verdict}; judged as sglang {version} as shipped (its version says so)"
    release = content.release if content else None
    if content and (known or content.release in registry.launch):
        table = registry.launch.get(content.release)
        settings = _settings(args, table, content.release)
        result = exposure.judge(settings, dict(content.races), table, assumed)
        lines, why = result.lines[:-1], ""
        if not known and result.code != Exit.EXPOSED:
            why = (
                f"this configuration would keep sglang {release} as shipped out of the race, "
                "but the files are not that release's, so whether it keeps them out is not known"
            )
    else:
        newest = max(registry.launch, key=release_key)
        settings = _settings(args, registry.launch[newest], newest)
        lines = [
            f"configuration parsed by {settings.parser}, with the flags of sglang {newest} "
            "(the newest release this project knows the flags of)",
            *(f"{name}: {settings.get(name)}" for name in exposure.FIELDS),
        ]
        why = (
            "no release can be assumed for these files (their distribution names none this "
            "project knows), so which races they leave open is not known"
        )
    if why:
        lines.append(f"verdict: exposure unknown: {verdict}; {why}")
        result = exposure.Exposure(Exit.EXPOSURE_UNKNOWN, lines)
    source = "server-info" if args.server_info else "launch-args"
    config = report.Configuration(source, settings, result.lines, release)
    return report.Outcome(found, result.code, result.lines[-1].removeprefix("verdict: "), config)


def _settings(args: Namespace, table: LaunchSettings | None, release: str) -> exposure.Settings:
    if args.server_info:
        settings = exposure.from_server_info(args.server_info, args.api_key, table, args.timeout)
    else:
        words, prefix = launchargs.read_launch_args(args.launch_args or "")
        words = launchargs.place_config(words, args.config, args.config_root)
        args.env.update(prefix)  # the command's own prefix, over the container's
        if table is None:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{zipapp.data_root() / RELEASES_NAME}: sglang {release} names no launch profile "
                "(launch = PROFILE), so the launch arguments cannot be read for that release",
                "name its [launch.PROFILE] (docs/maintaining.md, adding a release)",
            )
        if args.tree:
            why = "--tree: no interpreter here to run sglang's ServerArgs"
            settings = launchargs.parse_with_table(words, table, why)
        else:
            settings = serverargs.parse_with_server_args(args.python, words, args.env, table)
    settings.env = args.env
    if args.torch_build:
        settings.torch_build = args.torch_build
        settings.torch_source = f"--torch-build {args.torch_build}"
    return settings
