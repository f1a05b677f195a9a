"""Build a patched sglang wheel that pip installs over the official one."""

import argparse
import re
import subprocess
import zlib
from pathlib import Path

from patchset import cli, deploy, paths
from patchset.errors import BackportError, Exit
from patchset.manifest import Series, series_for_release

DESCRIPTION = """\
Write dist/sglang-<base>+<local>-<tags>.whl: the pinned, sha256-checked sglang
wheel with the series applied to its three files. Only those files, the
.dist-info folder name, METADATA's Version and RECORD differ (every other member
byte-identical, in the same order; sglang.__version__ stays the base's). The
local label is the manifest's [build-wheel] table's. Same inputs, same bytes:
the printed sha256 can be published. Each Python's wheel (cp310 to cp313) is
pinned ([wheels."<release>"]).
"""

WORDING = {
    Exit.OK: "the wheel was written (its path and sha256 are printed; with --all, each)",
    Exit.BASE_MISMATCH: "no patch set serves --base, or the wheel's files are not the pinned base",
    Exit.ENVIRONMENT: "--python cannot be run, or a file or folder cannot be written",
}
CODES = [*WORDING, Exit.PATCHSET_INVALID, Exit.WHEEL_HASH, Exit.WHEEL_UNAVAILABLE]
CODES += [Exit.APPLY_FAILED]
HELP = {
    "--base": "the sglang release to build for; picks the patch set under patches/ that serves "
    "it (with --patch-set: that folder must serve it)",
    "--python-version": "build the wheel for that Python (3.10 to 3.13; default: the manifest's "
    "own, 3.11)",
    "--python": "build the wheel for the Python of that interpreter (asked for its version)",
    "--all": "build the wheel of every Python the manifest pins",
    "--out": "output folder (default: dist/)",
}


def python_of(interpreter: Path) -> str:
    ask = "import sys; print(sys.implementation.name, *sys.version_info[:2])"
    command = [str(interpreter), "-I", "-c", ask]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        answer, detail = None, str(err)
    else:
        answer = None if result.returncode else re.fullmatch(r"(\w+) (\d+) (\d+)\n", result.stdout)
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
    if answer is None:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"--python {interpreter} could not be asked its version: {detail}",
            "pass the path of a Python interpreter that runs, or --python-version X.Y",
        )
    if answer[1] != "cpython":
        raise BackportError(
            Exit.USAGE,
            f"--python {interpreter} is {answer[1]}, not CPython; sglang ships CPython wheels only",
            "pass a CPython interpreter, or --python-version X.Y",
        )
    return f"cp{answer[2]}{answer[3]}"


def python_tag(text: str) -> str:
    if not (found := re.fullmatch(r"3\.(\d+)", text)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version X.Y (e.g. 3.12)")
    return f"cp3{found[1]}"


def main() -> int:
    p = cli.parser("build-wheel", DESCRIPTION, CODES, WORDING)
    cli.add_patch_set(p)
    p.add_argument("--base", metavar="VERSION", help=HELP["--base"])
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--python-version", type=python_tag, metavar="X.Y", help=HELP["--python-version"]
    )
    which.add_argument("--python", type=cli.absolute_path, metavar="PY", help=HELP["--python"])
    which.add_argument("--all", action="store_true", help=HELP["--all"])
    dist = paths.PROJECT_ROOT / "dist"
    p.add_argument("--out", type=cli.absolute_path, default=dist, metavar="DIR", help=HELP["--out"])
    args = p.parse_args()
    if args.base:  # the default --patch-set names the folder of patch sets to pick from
        series = series_for_release(args.patch_set.parent, args.base)
        if args.patch_set not in (series.folder, paths.DEFAULT_PATCH_DIR):
            p.error(f"--patch-set {args.patch_set} does not serve sglang {args.base}")
    else:
        series = Series.load(args.patch_set)
    pinned = series.manifest.release.wheels
    wanted = args.python_version or (python_of(args.python) if args.python else None)
    if wanted is not None and wanted not in pinned:
        pins = ", ".join(f"3.{t[3:]}" for t in pinned)
        version = series.manifest.base.version
        p.error(f"sglang {version} has no wheel for Python 3.{wanted[3:]} pinned (it pins {pins})")
    for python in list(pinned) if args.all else [wanted]:
        built = deploy.build_wheel(series, paths.cache_dir(), args.out, python)
        for member in built.changed:
            print(f"  changed: {member}")
        print(f"wheel: {built.path}\nversion: {built.version}\nsha256: {built.sha256}")
    print(f"(zlib {zlib.ZLIB_RUNTIME_VERSION}; the same inputs and zlib give the same bytes)")
    return Exit.OK
