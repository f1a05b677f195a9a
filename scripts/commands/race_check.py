"""Which FutureMap stream races each step leaves open, on the CPU: the scenarios run in a child
forked per tree (a process imports one sglang) that pickles its races back to the verdict."""

import argparse
import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

from patchset import buildtree, cli, lock, paths
from patchset.catalog import blobs_of, step_in
from patchset.errors import BackportError, Exit
from patchset.manifest import Series, patch_set_folders, replace_tables, series_for_release
from patchset.plays import PLAYS, SCENARIOS
from racecheck import csan, report, writers
from treefork import fork_each, preload, use_tree

SCRIPTS = Path(__file__).resolve().parents[1]
REEXEC = "SGLANG_BACKPORTS_RACE_CHECK_PYTHON"  # set once it runs on the chosen interpreter

DESCRIPTION = """\
Prove on the CPU, from the real sglang code, which stream races in the PD-decode
prebuilt path each step of the patch series closes: simulated CUDA streams and
events feed the vector clocks of PyTorch's CUDA sanitizer, which checks every
aten read and write of a FutureMap relay buffer row by row. The scenarios run
through the tree's own FutureMap, build_eagle_disagg_draft_input,
get_new_prebuilt_batch and (L*) WAR barrier:
{scenarios}

Default: the final step of the series (the patched tree) in the build tree.
Each tree runs in its own forked process, one per core at a time. The expected
table is the [races] table of each base's pin.toml.
"""

EPILOG = """\
verdict:
  --tree DIR, --step FINAL (default)  the column of the final step (no race)
  --step STEP                         that step's column of the expected table
  --step all                          the whole expected table
  --base VERSION                      that release's series (its patch set and build tree)
  --base all --step all               every base's whole table, one line per tree as it starts
  --step STEP --tree DIR ...          both: the steps' columns as above, each tree as patched
"""

CODES = (Exit.RACE, Exit.SCENARIO, Exit.PATCHSET_INVALID, Exit.STALE)
WORDING = {
    Exit.OK: "the measured table is the expected one (no race in a patched or given "
    "tree); --writers: every writer is classified",
    Exit.RACE: "a race in the patched or given tree, or the table differs from the "
    "expected one; --writers: a writer the table does not classify",
    Exit.ENVIRONMENT: "no usable environment: no python with torch, a torch whose "
    "private sanitizer API changed shape, no build tree, or a tree without python/sglang",
    Exit.PATCHSET_INVALID: "the patch set's pin.toml lacks the [races] or [writers] table "
    "or holds a wrong entry there",
    Exit.STALE: "(--check-expected) a [races] table is not what the run measured",
}
ALL = "all"
HELP = {
    "--step": "a step of the series in the build tree, or all (default: {finals}); with "
    "several bases, a base without that step is left out",
    "--tree": "a folder holding python/sglang: its open races, compared with the step its "
    "files hold, if any (repeatable; with --step, columns beside the steps')",
    "--write-expected": "run every step (of every base, or of --base) and write the [races] "
    "tables; refused, writing nothing, when a series' final step leaves a race open",
    "--check-expected": "run as --write-expected does; exit 13 when a table is not what the "
    "run measured, writing nothing (CI runs it)",
    "--writers": "instead of racing, list every FutureMap writer of the tree (an ast scan) "
    "with its [writers] row's stream and ordering; an unclassified one fails",
    "--python": "interpreter with torch and sglang's import closure (default: this one if it "
    "has torch, else build/venv/bin/python)",
    "--base": "the sglang release whose series and build tree to check, or {all!r} for "
    "every patch set under patches/ (default: {base}, or --patch-set's)",
}


def parse_args(argv: list[str] | None) -> tuple[list[Series], argparse.Namespace]:
    """The series --base or --patch-set name, read first for --step's choices; the arguments."""
    early = argparse.ArgumentParser(add_help=False)
    cli.add_patch_set(early)
    early.add_argument("--base")
    early.add_argument("--write-expected", "--check-expected", action="store_true", dest="tables")
    known, _ = early.parse_known_args(argv)
    if known.base is None and known.tables and known.patch_set == paths.DEFAULT_PATCH_DIR:
        known.base = ALL
    if known.base is None:
        series = [Series.load(known.patch_set)]
    elif known.patch_set != paths.DEFAULT_PATCH_DIR:
        raise BackportError(Exit.USAGE, "--base and --patch-set name the series twice", "pass one")
    elif known.base == ALL:
        series = [Series.load(folder) for folder in patch_set_folders(paths.PATCHES_ROOT)]
    else:
        series = [series_for_release(paths.PATCHES_ROOT, known.base)]
    steps = list(dict.fromkeys(step for s in series for step in s.manifest.steps))
    finals = ", ".join(dict.fromkeys(s.manifest.final_step for s in series))
    text = "\n".join(
        textwrap.fill(play.text, 78, initial_indent=f"  {play.name:<4} ", subsequent_indent=" " * 7)
        for play in PLAYS
    )
    p = cli.parser("race-check", DESCRIPTION.format(scenarios=text), CODES, WORDING, EPILOG)
    tables = p.add_mutually_exclusive_group()
    for flag, options in (
        ("--step", {"choices": [*steps, ALL]}),
        ("--tree", {"type": cli.absolute_path, "action": "append", "metavar": "DIR"}),
        ("--write-expected", {"action": "store_true"}),
        ("--check-expected", {"action": "store_true"}),
        ("--writers", {"action": "store_true"}),
        ("--python", {"type": cli.absolute_path, "metavar": "PATH"}),
        ("--base", {"metavar": "VERSION"}),
    ):
        what = HELP[flag].format(finals=finals, all=ALL, base=paths.DEFAULT_BASE)
        (tables if flag.endswith("-expected") else p).add_argument(flag, help=what, **options)
    cli.add_patch_set(p)
    return series, p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    chosen, args = parse_args(argv)
    several = len(chosen) > 1
    if args.writers:
        if args.tree and (len(args.tree) > 1 or several):
            raise BackportError(
                Exit.USAGE, "--writers takes one --tree, with one base", "name one tree"
            )
        trees = [buildtree.check_tree(tree, Exit.ENVIRONMENT) for tree in args.tree or []]
        trees = trees or [step_trees(s)[s.manifest.final_step] for s in chosen]
        return max([writers.main(tree, s.manifest) for tree, s in zip(trees, chosen, strict=True)])
    if args.tree and several:
        raise BackportError(Exit.USAGE, "--tree takes one base", "pass --base VERSION")
    regenerate = args.write_expected or args.check_expected
    if regenerate and (args.tree or args.step not in (None, ALL)):
        raise BackportError(
            Exit.USAGE,
            "--write-expected and --check-expected run every step of the bases' build trees",
            "leave out --tree, --writers and --step",
        )
    python = choose_python(args.python)
    same = os.path.realpath(python.absolute().parent.parent) == os.path.realpath(sys.prefix)
    if not same and REEXEC not in os.environ:
        # The whole check runs on that interpreter: the trees' children fork from it.
        os.environ[REEXEC] = str(python)
        sys.stdout.flush()
        command = sys.argv[1:] if argv is None else argv
        os.execv(python, [str(python), str(SCRIPTS / "race-check"), *command])
    runs = plan_runs(chosen, ALL if regenerate else args.step, args.tree or [], regenerate)
    started = time.perf_counter()
    preload_s, failed = run_trees(runs)
    wall = time.perf_counter() - started
    runs = [run for n, run in enumerate(runs) if n not in failed]  # the others: said at the end
    if failed and (regenerate or not runs):
        raise next(iter(failed.values()))  # no table is written, or none to show
    bases: dict[str, dict[str, None]] = {}  # barrier -> the bases it was found in
    for version in dict.fromkeys(r.version for r in runs):
        if several:
            print(f"sglang {version}:")
        print(report.grid_text([r for r in runs if r.version == version]) + "\n")
    for tree_run in runs:
        report.print_races(tree_run)
        bases.setdefault(tree_run.barrier, {})[tree_run.version] = None
    barriers = [f"{' '.join(b)}: {how}" if several else how for how, b in bases.items()]
    print(f"ran on {csan.torch_text(runs[0].torch)}; WAR barrier " + "; ".join(barriers))
    timings = "; ".join(
        f"{r.label} sglang import {r.import_s:.1f} s + scenarios {r.run_s:.2f} s" for r in runs
    )
    print(f"timings: third-party imports {preload_s:.1f} s (once); {timings}; wall {wall:.1f} s")
    if regenerate:
        return expected_tables(chosen, runs, write=args.write_expected)
    code = report.verdict(runs)  # a race stays the exit code beside a failed run: worse news
    if errors := list(failed.values()):
        why = "; ".join(err.problem for err in errors) + " (the other trees' tables are above)"
        raise BackportError(code or errors[0].code, why, errors[0].next_step)
    return code


def plan_runs(
    chosen: list[Series], step: str | None, given: list[Path], regenerate: bool = False
) -> list[report.TreeRun]:
    """The chosen steps' columns, then each given tree's (judged by the step its files
    hold); regenerate: a scenario missing from pin.toml is expected clean, not refused."""
    runs: list[report.TreeRun] = []
    for series in chosen:
        manifest = series.manifest
        version, final = manifest.base.version, manifest.final_step
        named = [n for n in SCENARIOS if n in manifest.races or not regenerate]
        expected = dict.fromkeys(SCENARIOS, dict.fromkeys(manifest.steps, report.Cell()))
        expected |= report.expected_table(manifest, named)
        wanted = step or ("" if given else final)
        if wanted and wanted != ALL and wanted not in manifest.steps:
            print(f"race-check: sglang {version} has no step {wanted}; left out")
        elif wanted:
            trees = step_trees(series)
            prefix = f"{version} " if len(chosen) > 1 else ""
            for s in manifest.steps if wanted == ALL else [wanted]:
                label = prefix + report.step_label(s)
                runs.append(report.TreeRun(label, s, trees[s], expected, final, version))
        for n, tree in enumerate(given, 1):
            checked = buildtree.check_tree(tree, Exit.ENVIRONMENT)
            label = f"tree {n}" if len(given) > 1 else "tree"
            found = {p: checked / p for p in manifest.files}
            files = {p: f.read_bytes() if f.is_file() else None for p, f in found.items()}
            held = step_in(manifest, blobs_of(files)) or ""
            runs.append(report.TreeRun(label, held, checked, expected, final, version, given=True))
    return runs


def choose_python(explicit: Path | None) -> Path:
    if explicit is not None:
        if not explicit.is_file():
            raise BackportError(
                Exit.ENVIRONMENT, f"--python {explicit}: no such file", "pass an interpreter"
            )
        # the whole command runs again on it (main): a Python 3.11+, asked once
        probe = "import sys; print('race-check can run:', sys.version_info >= (3, 11))"
        try:
            answer = subprocess.run(
                [str(explicit), "-c", probe], capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError) as err:
            answer = str(err)
        if answer.strip() != "race-check can run: True":
            raise BackportError(
                Exit.ENVIRONMENT,
                f"--python {explicit} is not a Python 3.11 or newer",
                "pass one with torch (build/venv/bin/python, which run-tests makes)",
            )
        return explicit
    if importlib.util.find_spec("torch") is not None:
        return Path(sys.executable)
    venv = paths.build_dir() / "venv" / "bin" / "python"
    if venv.is_file():
        return venv
    raise BackportError(
        Exit.ENVIRONMENT,
        f"torch is not importable with {sys.executable} and there is no {venv}",
        "run scripts/run-tests once (it makes build/venv with the pinned requirements), "
        "or pass --python PATH",
    )


def step_trees(series: Series) -> dict[str, Path]:
    build = paths.build_dir()
    if not buildtree.build_tree_path(series, build).is_dir():
        raise BackportError(
            Exit.ENVIRONMENT,
            f"there is no build tree in {build}",
            "run scripts/apply-patches (or scripts/run-tests), or pass --tree DIR",
        )
    return buildtree.step_trees(series, build)


def expected_tables(chosen: list[Series], runs: list[report.TreeRun], write: bool) -> int:
    """Compare each base's measured table with its [races] tables; write them if asked. A
    final step with a race is refused first: a wrong fix must never become expected."""
    finals = [r for r in runs if r.step == r.expected_final]
    if opened := ", ".join(f"{r.label} ({n})" for r in finals for n in SCENARIOS if r.races[n]):
        print(f"FAILED: the final step of a series leaves races open: {opened}; nothing written")
        return Exit.RACE
    stale = []
    for series in chosen:
        manifest = series.manifest
        mine = [r for r in runs if r.version in ("", manifest.base.version)]
        measured = {n: {r.step: report.cell_of(r.races[n]) for r in mine} for n in SCENARIOS}
        written = report.expected_table(manifest, [n for n in SCENARIOS if n in manifest.races])
        differ = [name for name in SCENARIOS if written.get(name) != measured[name]]
        pin = series.folder / "pin.toml"
        if not differ:
            print(f"ok: {pin} [races] is what the run measured")
        elif write:
            races = {f"races.{n}": report.table_lines(measured[n]) for n in SCENARIOS}
            pin.write_text(replace_tables(pin.read_text(encoding="utf-8"), races), encoding="utf-8")
            print(f"wrote {pin} [races]: {', '.join(differ)} changed")
        else:
            print(f"STALE: {pin} [races] differs from the run in: {', '.join(differ)}")
            stale.append(str(pin))
    if stale:
        raise BackportError(
            Exit.STALE,
            f"the [races] tables of {', '.join(stale)} are not what the run measured "
            "(the grid above marks each differing cell EXPECTED)",
            "if the change is wanted, run scripts/race-check --write-expected and commit "
            "the tables; otherwise find what changed the races",
        )
    return Exit.OK


def _run(tree: Path) -> dict[str, Any]:
    """The tree's TreeRun fields, measured in this process; a BackportError says why not."""
    started = time.perf_counter()
    use_tree(tree)
    try:
        import sglang.srt.disaggregation.decode  # noqa: F401
    except Exception as err:  # any import failure of the tree is reported, not raised
        hint = "use an interpreter with sglang's import closure (build/venv from scripts/run-tests"
        hint = f"{hint}, or --python PATH)" if isinstance(err, ModuleNotFoundError) else ""
        why = f"importing sglang failed: {_short(err)}"
        raise BackportError(Exit.SCENARIO, why, hint) from None
    import torch
    from racecheck import scenarios, treecode

    root, expected = scenarios.sglang_root(), (tree / "python" / "sglang").resolve()
    if root != expected:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"sglang was imported from {root}, not from {expected}; another "
            "sglang (an installed package?) shadows the tree",
            "use an interpreter without sglang installed (build/venv, or --python PATH)",
        )
    imported = time.perf_counter()
    races = {}
    for name in SCENARIOS:
        try:
            races[name] = scenarios.run(name)
        except Exception as err:  # the tree's API differs from what the scenario drives
            problem = f"scenario {name} could not run: {_short(err)}"
            raise BackportError(Exit.SCENARIO, problem) from None
    return {
        "torch": torch.__version__,
        "barrier": treecode.war_barrier_of_tree().how,
        "import_s": round(imported - started, 2),
        "run_s": round(time.perf_counter() - imported, 3),
        "races": races,
    }


def _short(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def run_trees(runs: list[report.TreeRun]) -> tuple[float, dict[int, BackportError]]:
    """Each tree's scenarios into its run; the preload's seconds, and each failed run's why."""
    csan.load()  # a torch whose sanitizer changed shape is refused before anything runs
    preload_s = preload()
    started = f"race-check: {len(SCENARIOS)} scenarios on {{0.label}} ({{0.tree}})"
    with lock.marked_folder(lock.tmpdir(), "race-check-") as tmp:
        jobs = [(run, tmp / f"{n}.pickle") for n, run in enumerate(runs)]
        # More children than cores would only share them and hold more memory.
        fork_each(jobs, os.cpu_count() or 1, _child, lambda job: print(started.format(job[0])))
        failed = {n: err for n, (run, out) in enumerate(jobs) if (err := _take_result(run, out))}
    return preload_s, failed


def _child(job: tuple[report.TreeRun, Path]) -> int:
    run, out = job
    # What the tree's imports print (warnings, mostly) is not the checker's report.
    log = os.open(out.with_suffix(".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    result: dict[str, Any] | tuple[Exit, str, str]
    try:
        result = _run(run.tree)
    except BackportError as err:
        result = (err.code, err.problem, err.next_step)
    except BaseException:
        result = (Exit.INTERNAL, traceback.format_exc(), "")
    out.write_bytes(pickle.dumps(result))
    return 0


def _take_result(run: report.TreeRun, out: Path) -> BackportError | None:
    """What the child wrote into run, else why not (a fault of the checker is raised)."""
    if not out.is_file():
        log = out.with_suffix(".log")
        printed = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
        result = (
            Exit.ENVIRONMENT,
            "its process ended without a result:\n" + "\n".join(printed[-15:]),
            "check that this interpreter imports torch, or pass --python PATH",
        )
    elif isinstance(result := pickle.loads(out.read_bytes()), dict):
        vars(run).update(result)
        return None
    code, problem, next_step = result
    if code == Exit.INTERNAL:
        print(problem, file=sys.stderr)
        raise RuntimeError(f"the checker failed on {run.tree} (the trace above)")
    return BackportError(code, f"{run.label} ({run.tree}): {problem}", next_step)
