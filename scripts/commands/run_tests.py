"""Run the project's tests: the tools' tests once, the sglang tests once per base and step."""

import argparse
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from patchset import apply, buildtree, cli, lock, paths, textout
from patchset.errors import EXIT_TEXT, BackportError, Exit
from patchset.manifest import Series, patch_set_folders, series_for_release
from testrun import runner, venv

DESCRIPTION = """\
Set up and run every test of the project (docs/testing.md says how).

1. For every sglang release served under patches/ (or those named with --base),
   make or sync the test environment of its own pins: requirements/<env>.txt,
   exact and hashed, made with uv (requirements/uv.txt) in the cache folder;
   releases with the same pins share one environment.
2. Apply each release's series to its build tree (as scripts/apply-patches
   does) and lay out one tree per step under build/steps/<release>/.
3. Run pytest on test/steps once per release and step, in children forked
   after the heavy imports, --parallel at once. A test marked pass_on(...)
   must fail, with an AssertionError, on the steps that lack its fix (strict
   xfail). Then run test/tools once, in the default release's environment,
   with --parallel pytest-xdist workers.
4. Print, per release, a table of each step test's outcome per step and the
   race table measured at each step, then each run's verdict.

Outcomes (JSON), logs and JUnit XML of every run go to build/test-results/.
"""

OUTCOMES = """\
outcomes in the table:
  pass             the test passed
  FAIL (expected)  a test guarding a fix failed (an AssertionError) on a step without
                   that fix, as it must
  skip             skipped (e.g. a GPU test on a machine without one)
  FAIL             the test failed
  PASS (must fail) a guarding test passed on a step without its fix
  ERROR            an error outside the test body (fixture, collection)
"""

HELP = {
    "--base": "test this sglang release (repeatable; default: every release served)",
    "--tree": "run only the step suite, against DIR/python/sglang, judged as the final step "
    "of the default series (or of --base/--patch-set) (repeatable: one column per tree, "
    "every tree in one worker)",
    "--python": "use this interpreter, whose environment already holds the requirements, "
    "for every run instead of the per-release environments",
    "--patch-set": "test only this patch set folder (its primary release)",
    "--parallel": "step runs at once, and pytest-xdist workers for test/tools "
    "(default: 2, or 1 on one core)",
}
APPLY_CODES = (Exit.DIRTY_TREE, Exit.ALREADY_UPSTREAM, Exit.PATCHSET_INVALID, Exit.NOT_A_CHECKOUT)
APPLY_CODES += (Exit.WHEEL_HASH, Exit.WHEEL_UNAVAILABLE, Exit.APPLY_FAILED, Exit.BRANCH_EXISTS)
CODES = {
    Exit.OK: "every pytest run passed",
    Exit.BASE_MISMATCH: "--base names a release no patch set here serves",
    Exit.TESTS_FAILED: "a pytest run failed, or collected no test at all",
    Exit.SETUP: "a test environment could not be set up (uv, venv, --tree, --python)",
    **{code: f"applying a series failed: {EXIT_TEXT[code]}" for code in APPLY_CODES},
    Exit.LOCKED: EXIT_TEXT[Exit.LOCKED],
}


def parse_args() -> argparse.Namespace:
    p = cli.parser("run-tests", DESCRIPTION, CODES, CODES, epilog=OUTCOMES)
    p.add_argument("--base", action="append", metavar="VERSION", help=HELP["--base"])
    p.add_argument(
        "--tree", action="append", type=cli.absolute_path, metavar="DIR", help=HELP["--tree"]
    )
    p.add_argument("-k", metavar="EXPR", help="passed to every pytest run (pytest -k)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--steps-only", action="store_true", help="skip test/tools")
    only.add_argument("--tools-only", action="store_true", help="skip test/steps")
    p.add_argument("--python", type=cli.absolute_path, metavar="PATH", help=HELP["--python"])
    p.add_argument("--patch-set", type=cli.absolute_path, metavar="DIR", help=HELP["--patch-set"])
    cores = min(2, os.cpu_count() or 1)
    p.add_argument("--parallel", type=int, default=cores, metavar="N", help=HELP["--parallel"])
    args = p.parse_args()
    if args.tree and args.tools_only:
        p.error("--tree runs the step suite; it cannot be combined with --tools-only")
    if args.parallel < 1:
        p.error("--parallel must be at least 1")
    return args


def selected_series(args: argparse.Namespace) -> list[Series]:
    if args.patch_set:
        return [Series.load(args.patch_set)]
    if args.base:
        return [series_for_release(paths.PATCHES_ROOT, version) for version in args.base]
    if args.tree:
        return [Series.load(paths.DEFAULT_PATCH_DIR)]
    return [
        Series.load(folder).for_release(release)
        for folder in patch_set_folders(paths.PATCHES_ROOT)
        for release in Series.load(folder).manifest.releases
    ]


def environments(
    given: Path | None, series: list[Series], pool: ThreadPoolExecutor
) -> Callable[[Series], Path]:
    """A release -> its environment's python, made in pool while the series are applied, one
    at a time (two made at once with the same torch both download it); or --python."""
    if given is not None and not given.is_file():
        raise BackportError(Exit.SETUP, f"--python {given} does not exist", "pass a python binary")
    if given is not None:
        return lambda _series: given
    venv.uv_binary()  # bootstrapped once, here, before the threads share it
    # one future per environment: releases with the same pins share it
    start = functools.cache(functools.partial(pool.submit, make_env))
    for one in series:
        start(venv.env_for(one.manifest))
    return lambda one: start(venv.env_for(one.manifest)).result()


def make_env(env: venv.TestEnv) -> Path:
    started = time.monotonic()
    state = "made" if venv.ensure_venv(env.venv, env.requirements, env.name) else "synced"
    took = time.monotonic() - started
    print(f"environment {env.name}: {env.venv} ({state} in {took:.0f}s)", flush=True)
    return env.python


def link_default_venv(python: Path, build: Path) -> None:
    """build/venv points at the default release's environment (ruff, race-check use it)."""
    link, target = build / "venv", python.parent.parent
    stale = link.is_symlink() and link.readlink() != target  # a real folder there is the user's
    if stale or not (link.is_symlink() or link.exists()):
        venv.make_aside(link, link, lambda made: made.symlink_to(target, target_is_directory=True))


def main() -> int:
    args = parse_args()
    venv.check_interpreter()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uv")
    try:
        return run(args, pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run(args: argparse.Namespace, pool: ThreadPoolExecutor) -> int:
    chosen = selected_series(args)
    started = time.monotonic()
    default = Series.load(paths.DEFAULT_PATCH_DIR)
    python_of = environments(args.python, [default, *([] if args.tools_only else chosen)], pool)
    build = paths.build_dir()
    extra = ["-k", args.k] if args.k else []
    phases: dict[str, float] = {}

    # per table printed at the end: title, headers, runs, the release whose environment runs them
    tables: list[tuple[str, list[str], list[runner.SuiteRun], Series]] = []
    if args.tree:
        series, final = chosen[0], chosen[0].manifest.final_step
        labels = [f"tree-{n}" for n in range(1, 1 + len(args.tree))] if args.tree[1:] else ["tree"]
        trees = {label: buildtree.check_tree(t) for label, t in zip(labels, args.tree, strict=True)}
        runs = [runner.step_run(label, series, final, tree) for label, tree in trees.items()]
        title = f"--tree (as {series.manifest.base.version} +{final})"
        tables.append((title, list(trees), runs, series))
    elif not args.tools_only:
        for series in chosen:
            report = apply.apply_to_build_tree(series, build, paths.cache_dir())
            # a successful apply holds the signals for the process; Ctrl-C must still stop us
            lock.release_interrupts()
            version = series.manifest.base.version
            if not report.applied:
                print(f"series {version}: already applied in {report.where}")
            for name in report.applied:
                print(f"series {version}: applied {name}")
            trees = buildtree.step_trees(series, build)
            runs = [runner.step_run(f"{version}-{s}", series, s, t) for s, t in trees.items()]
            headers = [s if s == series.manifest.steps[0] else f"+{s}" for s in trees]
            tables.append((version, headers, runs, series))
    phases["apply and step trees"] = time.monotonic() - started

    waited = time.monotonic()
    tools_python = python_of(default)
    if not args.python:
        link_default_venv(tools_python, build)
    by_python: dict[Path, list[runner.SuiteRun]] = {}
    for _title, _headers, runs, series in tables:
        by_python.setdefault(python_of(series), []).extend(runs)
    phases["waiting for the environments"] = time.monotonic() - waited
    started = time.monotonic()
    runner.run_forked(by_python, extra, args.parallel)
    phases["step suites"] = time.monotonic() - started

    # test/tools after the step runs: on two cores, both at once took longer (docs/performance.md)
    all_runs: list[runner.SuiteRun] = []
    if not args.steps_only and not args.tree:
        all_runs.append(runner.SuiteRun("tools", runner.TOOL_TESTS, {}))
        textout.progress(f"test/tools started with {tools_python}, {args.parallel} xdist worker(s)")
        started = time.monotonic()
        runner.run_tools(tools_python, all_runs[0], extra, args.parallel)
        phases["test/tools"] = time.monotonic() - started

    for title, headers, runs, _series in tables:
        all_runs += runs
        print(f"\nstep suite on sglang {title} (test/steps), one pytest run per step:")
        print(runner.step_table(runs, headers))
        if races := runner.step_table(runs, headers, prefix="race:"):
            print(f"\nraces measured by scripts/racecheck on each step of {title}:\n{races}")
    print()
    width = max((len(r.label) for r in all_runs), default=5)
    for suite in all_runs:
        print(f"{suite.label:>{width}}: {suite.verdict()}")
    print("time: " + "; ".join(f"{name} {secs:.0f}s" for name, secs in phases.items()))
    failed = [r.label for r in all_runs if r.returncode != 0]
    if failed or not all_runs:
        print(f"FAILED: {', '.join(failed) or 'nothing ran'}")
        return Exit.TESTS_FAILED
    print(f"all {len(all_runs)} pytest runs passed")
    return Exit.OK
