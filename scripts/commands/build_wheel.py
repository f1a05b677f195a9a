"""Build a patched sglang wheel that pip installs over the official one."""

from __future__ import annotations

import zlib

from patchset import cli, deploy, paths
from patchset.errors import Exit
from patchset.manifest import Series, series_for_release

DESCRIPTION = """\
Write dist/sglang-<base>+<local>-<tags>.whl: the pinned, sha256-checked sglang
wheel with the series applied to its three files. Only those files, the
.dist-info folder name, METADATA's Version and RECORD differ from the original;
every other member is byte-identical and in the same order. sglang.__version__
stays the base's. The local label comes from the manifest's [build-wheel]
table. Same inputs, same bytes: the printed sha256 can be published.
"""

CODES = [
    Exit.BASE_MISMATCH, Exit.PATCHSET_INVALID, Exit.WHEEL_HASH,
    Exit.WHEEL_UNAVAILABLE, Exit.APPLY_FAILED,
]  # fmt: skip
WORDING = {
    Exit.OK: "the wheel was written (its path and sha256 are printed)",
    Exit.BASE_MISMATCH: "no patch set serves --base, or the wheel's files are not the pinned base",
}


def main() -> int:
    p = cli.parser("build-wheel", DESCRIPTION, CODES, WORDING)
    cli.add_patch_set(p)
    p.add_argument(
        "--base",
        metavar="VERSION",
        help="the sglang release to build for; picks the patch set under patches/ that "
        "serves it (with --patch-set: that folder must serve it)",
    )
    p.add_argument(
        "--out",
        type=cli.absolute_path,
        default=paths.PROJECT_ROOT / "dist",
        metavar="DIR",
        help="output folder (default: dist/)",
    )
    args = p.parse_args()
    if args.base and args.patch_set == paths.DEFAULT_PATCH_DIR:
        series = series_for_release(paths.PATCHES_ROOT, args.base)
    else:
        series = Series.load(args.patch_set)
        if args.base:
            series = series_for_release(args.patch_set.parent, args.base)
            if series.folder != args.patch_set:
                p.error(f"--patch-set {args.patch_set} does not serve sglang {args.base}")
    built = deploy.build_wheel(series, paths.cache_dir(), args.out)
    for member in built.changed:
        print(f"  changed: {member}")
    print(f"wheel: {built.path}")
    print(f"version: {built.version}")
    print(f"sha256: {built.sha256}")
    print(f"(zlib {zlib.ZLIB_RUNTIME_VERSION}; the same inputs and zlib give the same bytes)")
    return Exit.OK
