"""Judge sglang releases newer than the ones this project knows, by their code."""

import contextlib

from patchset import cli
from patchset.errors import Exit
from patchset.manifest import load_releases, release_key
from racecheck import writers

DESCRIPTION = """\
Judge each sglang release on the package index newer than the newest that
patches/releases.toml knows, by its code: its wheel is downloaded with pip (its
sha256 printed), its three files judged by their shape (the ordering between
prepare_for_prebuilt() and process_prebuilt() on every path with overlap on),
and its tree scanned for FutureMap writers (race-check --writers). It passes when
judged fixed with every writer classified by a pin.toml's [writers] table or by
patches/upstream-writers.toml. Nothing of the wheel is installed or imported.
With --release or --wheel, only those are judged (a release releases.toml pins
comes hash-checked from the wheel cache).
"""

CODES = (Exit.RACE, Exit.WHEEL_UNAVAILABLE, Exit.WHEEL_HASH, Exit.PATCHSET_INVALID)
WORDING = {
    Exit.OK: "every release judged is fixed and all its FutureMap writers are classified "
    "(or there is no newer release)",
    Exit.RACE: "a release is not judged fixed (affected, fix A only, another design, or "
    "cannot tell), or has a FutureMap writer no manifest classifies: each is named",
    Exit.WHEEL_UNAVAILABLE: "the package index could not be listed, or a wheel could not "
    "be downloaded",
}


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("watch-releases", DESCRIPTION, CODES, WORDING)
    for flag, meta, kind, what in (
        ("--release", "VERSION", str, "judge this sglang release instead of listing newer ones"),
        ("--wheel", "FILE", cli.absolute_path, "judge this sglang wheel file"),
    ):
        p.add_argument(
            flag, action="append", default=[], type=kind, metavar=meta, help=f"{what} (repeatable)"
        )
    args = p.parse_args(argv)
    if missing := [w for w in args.wheel if not w.is_file()]:
        p.error(f"--wheel {missing[0]}: no such file")
    registry = load_releases()
    classes = writers.classified()
    releases = args.release or ([] if args.wheel else writers.newer_releases(registry))
    if not releases and not args.wheel:
        newest = max(registry.known, key=release_key)
        print(f"watch-releases: no sglang release on the package index is newer than {newest}")
        return Exit.OK
    wheels = [(v, writers.release_wheel(v, registry)) for v in releases]
    wheels += [(w.name, contextlib.nullcontext(w)) for w in args.wheel]
    failed = []
    for release, wheel in wheels:
        with wheel as wheel_file:
            passed, lines = writers.judge_wheel(release, wheel_file, classes)
        if not passed:
            failed.append(release)
        print("\n".join(lines) + "\n")
    if failed:
        print(
            f"FAILED: {len(failed)} of {len(wheels)} not judged fixed with every writer "
            f"classified: {', '.join(failed)}"
        )
        return Exit.RACE
    print(f"ok: {len(wheels)} judged fixed, every FutureMap writer classified")
    return Exit.OK
