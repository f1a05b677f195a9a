"""Judge sglang releases newer than the ones this project knows, by their code."""

from __future__ import annotations

from patchset import cli, paths
from patchset.errors import Exit
from patchset.manifest import load_releases, release_key
from racecheck import upstream

DESCRIPTION = """\
List the sglang releases on the package index newer than the newest that
patches/releases.toml knows, and judge each one by its code: its wheel is
downloaded with pip (its sha256 printed), laid out in a temporary folder, its
three files judged by their shape (the ordering between prepare_for_prebuilt()
and process_prebuilt() on every path with overlap on, fix A, the design), and
its whole tree scanned for FutureMap writers (race-check --writers). A
release passes when it is judged fixed and every writer is classified by a
pin.toml's [writers] table or by patches/upstream-writers.toml. Nothing of the
wheel is installed or imported.

With --release or --wheel, only those are judged (a release that
releases.toml pins comes hash-checked from the wheel cache, offline once
cached).
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
    p.add_argument(
        "--release",
        action="append",
        metavar="VERSION",
        help="judge this sglang release instead of listing newer ones (repeatable)",
    )
    p.add_argument(
        "--wheel",
        action="append",
        type=cli.absolute_path,
        metavar="FILE",
        help="judge this sglang wheel file (repeatable)",
    )
    args = p.parse_args(argv)
    registry = load_releases()
    classes = upstream.classified()
    cache = paths.cache_dir()
    for wheel_file in args.wheel or []:
        if not wheel_file.is_file():
            p.error(f"--wheel {wheel_file}: no such file")
    releases = args.release or ([] if args.wheel else upstream.newer_releases(registry))
    newest = max(registry.known, key=release_key)
    if not releases and not args.wheel:
        print(f"watch-releases: no sglang release on the package index is newer than {newest}")
        return Exit.OK
    verdicts = []
    for version in releases:
        with upstream.release_wheel(version, registry, cache) as wheel_file:
            verdicts.append(upstream.judge_wheel(version, wheel_file, classes))
        report(verdicts[-1])
    for wheel_file in args.wheel or []:
        verdicts.append(upstream.judge_wheel(wheel_file.name, wheel_file, classes))
        report(verdicts[-1])
    failed = [v for v in verdicts if not v.passed]
    if failed:
        print(
            f"FAILED: {len(failed)} of {len(verdicts)} not judged fixed with every writer "
            f"classified: {', '.join(v.release for v in failed)}"
        )
        return Exit.RACE
    print(f"ok: {len(verdicts)} judged fixed, every FutureMap writer classified")
    return Exit.OK


def report(verdict: upstream.Verdict) -> None:
    print(f"sglang {verdict.release}: {verdict.wheel} sha256 {verdict.sha256}")
    print("\n".join(f"  {line}" for line in verdict.judgement.lines()))
    for problem in verdict.problems():
        print(f"  FAILED: {problem}")
    if verdict.passed:
        print("  ok: judged fixed, every FutureMap writer classified")
    print()
