"""scripts/race-check: run the scenarios on step trees or a given tree, print table and races."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from . import report
from .races import Race

SCRIPTS = Path(__file__).resolve().parents[1]
TREE_LABEL = "tree"


class Exit(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    RACE = 15
    ENVIRONMENT = 16
    SCENARIO = 17


DESCRIPTION = """\
Prove on the CPU, from the real sglang code, which stream races in the
PD-decode prebuilt path each step of the patch series closes.

Simulated CUDA streams and events feed the vector clocks of PyTorch's CUDA
sanitizer; every aten read and write of a FutureMap relay buffer is checked
row by row. Three scenarios run through the tree's own FutureMap,
build_eagle_disagg_draft_input and get_new_prebuilt_batch:
{scenarios}

Default: step 0002 (the patched tree) of the build tree. Each tree runs in its
own process (one sglang per process), forked after the heavy third-party
imports, all of them at once.
"""

EPILOG = f"""\
verdict:
  --tree DIR, --step 0002 (default)  any race fails
  --step base|0001                   the step's column must equal the expected table
  --step all                         the whole table must equal the expected table

exit codes:
   0  no race (patched or given tree), or the measured table is the expected one
   1  internal error (a bug in this tool)
   2  bad command-line usage
  {Exit.RACE}  a race in the patched or given tree, or the table differs from the expected one
  {Exit.ENVIRONMENT}  no usable environment: no python with torch, torch or its sanitizer
      not as pinned, no build tree, or a tree without python/sglang
  {Exit.SCENARIO}  a scenario could not run on the tree (import failed or the sglang API differs)
"""


class Refusal(Exception):
    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class TreeRun:
    label: str  # a step name or TREE_LABEL
    tree: Path
    races: dict[str, list[Race]] = field(default_factory=dict)
    import_s: float = 0.0
    run_s: float = 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="race-check",
        description=DESCRIPTION.format(
            scenarios="\n".join(
                textwrap.fill(text, 78, initial_indent=f"  {name}  ", subsequent_indent=" " * 6)
                for name, text in report.SCENARIO_TEXT.items()
            )
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--step",
        choices=[*report.STEPS, "all"],
        help="a step of the series in the build tree, or all of them (default: 0002)",
    )
    which.add_argument("--tree", type=Path, metavar="DIR", help="a folder holding python/sglang")
    p.add_argument(
        "--python",
        type=Path,
        metavar="PATH",
        help="interpreter with torch and sglang's import closure (default: this one if it "
        "has torch, else build/venv/bin/python)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except Refusal as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("error: internal error in race-check (the trace above)", file=sys.stderr)
        return Exit.INTERNAL


def run(args: argparse.Namespace) -> int:
    python = choose_python(args.python)
    if args.tree is not None:
        trees = {TREE_LABEL: check_tree(args.tree)}
    else:
        step = args.step or "0002"
        all_trees = step_trees()
        trees = all_trees if step == "all" else {step: all_trees[step]}
    started = time.perf_counter()
    runs, preload_s = run_trees(python, trees)
    wall = time.perf_counter() - started

    labels = list(trees)
    print(grid_text(runs, labels))
    print()
    for tree_run in runs:
        print_races(tree_run)
    print(
        f"timings: third-party imports {preload_s:.1f} s (once); "
        + "; ".join(
            f"{report.step_label(r.label) if r.label != TREE_LABEL else r.label} "
            f"sglang import {r.import_s:.1f} s + scenarios {r.run_s:.2f} s"
            for r in runs
        )
        + f"; wall {wall:.1f} s"
    )
    return verdict(runs)


def choose_python(explicit: Path | None) -> Path:
    if explicit is not None:
        if not explicit.is_file():
            raise Refusal(Exit.ENVIRONMENT, f"--python {explicit}: no such file")
        return explicit.absolute()
    if importlib.util.find_spec("torch") is not None:
        return Path(sys.executable)
    venv = build_dir() / "venv" / "bin" / "python"
    if venv.is_file():
        return venv
    raise Refusal(
        Exit.ENVIRONMENT,
        f"torch is not importable with {sys.executable} and there is no {venv}.\n"
        "next step: run scripts/run-tests once (it makes build/venv with the pinned "
        "requirements), or pass --python PATH",
    )


def build_dir() -> Path:
    sys.path.insert(0, str(SCRIPTS))
    from patchset import paths

    return paths.build_dir()


def check_tree(tree: Path) -> Path:
    tree = tree.resolve()
    if not (tree / "python" / "sglang" / "__init__.py").is_file():
        raise Refusal(
            Exit.ENVIRONMENT,
            f"--tree {tree} holds no python/sglang/__init__.py; pass the folder that "
            "contains python/sglang (an sglang checkout, or build/steps/<step>)",
        )
    return tree


def step_trees() -> dict[str, Path]:
    """The build tree's step trees, laid out (as git worktrees) if needed."""
    sys.path.insert(0, str(SCRIPTS))
    from patchset import buildtree, paths
    from patchset.errors import BackportError
    from patchset.manifest import Series

    try:
        series = Series.load(paths.DEFAULT_PATCH_DIR)
        build = paths.build_dir()
        if not buildtree.build_tree_path(series, build).is_dir():
            raise Refusal(
                Exit.ENVIRONMENT,
                f"there is no build tree in {build}.\nnext step: run scripts/apply-patches "
                "(or scripts/run-tests), or pass --tree DIR",
            )
        trees = buildtree.step_trees(series, build)
    except BackportError as err:
        raise Refusal(Exit.ENVIRONMENT, f"the step trees cannot be laid out: {err}") from None
    missing = [s for s in report.STEPS if s not in trees]
    if missing:
        raise Refusal(Exit.ENVIRONMENT, f"the series has no step {', '.join(missing)}")
    return {step: trees[step] for step in report.STEPS}


def run_trees(python: Path, trees: dict[str, Path]) -> tuple[list[TreeRun], float]:
    """Every tree's scenarios (see racecheck.worker), and the time spent preloading."""
    with tempfile.TemporaryDirectory(prefix="race-check-") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), *filter(None, [env.get("PYTHONPATH")])])
        proc = subprocess.run(
            [str(python), "-m", "racecheck.worker", tmp, *map(str, trees.values())],
            cwd=SCRIPTS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        outs = [Path(tmp) / f"{n}.json" for n in range(len(trees))]
        if proc.returncode != 0 or not all(out.is_file() for out in outs):
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            raise Refusal(
                Exit.ENVIRONMENT,
                f"the checker process ({python}) failed (exit {proc.returncode}):\n{tail}",
            )
        preload = Path(tmp) / "preload.json"
        preload_s = json.loads(preload.read_text())["preload_s"] if preload.is_file() else 0.0
        runs = [
            _tree_run(label, tree, json.loads(out.read_text()))
            for (label, tree), out in zip(trees.items(), outs, strict=True)
        ]
    return runs, preload_s


def _tree_run(label: str, tree: Path, result: dict[str, Any]) -> TreeRun:
    where = f"{label} ({tree})"
    if "error" in result:
        code = {
            "environment": Exit.ENVIRONMENT,
            "scenario": Exit.SCENARIO,
        }.get(result["kind"], Exit.INTERNAL)
        hint = ""
        if "ModuleNotFoundError" in result["error"]:
            hint = (
                "\nnext step: use an interpreter with sglang's import closure "
                "(build/venv from scripts/run-tests, or --python PATH)"
            )
        raise Refusal(code, f"{where}: {result['error']}{hint}")
    return TreeRun(
        label,
        tree,
        {
            name: [report.race_from_json(r) for r in races]
            for name, races in result["races"].items()
        },
        result["import_s"],
        result["run_s"],
    )


def grid_text(runs: list[TreeRun], labels: list[str]) -> str:
    columns = [report.step_label(label) if label != TREE_LABEL else label for label in labels]
    cells: dict[str, dict[str, str]] = {}
    for name in report.SCENARIOS:
        row: dict[str, str] = {}
        for tree_run, column in zip(runs, columns, strict=True):
            measured = report.cell_of(tree_run.races[name])
            text = report.describe(measured)
            expected = report.EXPECTED[name].get(tree_run.label)
            if expected is not None and expected != measured:
                text = f"{text} [EXPECTED: {report.describe(expected)}]"
            row[column] = text
        cells[name] = row
    return report.grid(columns, cells)


def print_races(tree_run: TreeRun) -> None:
    count = sum(len(races) for races in tree_run.races.values())
    label = report.step_label(tree_run.label) if tree_run.label != TREE_LABEL else TREE_LABEL
    if not count:
        print(f"{label}: no race\n")
        return
    print(f"{label}: {count} race{'s' if count != 1 else ''} ({tree_run.tree})")
    for name, races in tree_run.races.items():
        for race in races:
            print(f"[{name}] " + report.race_text(race))
    print()


def verdict(runs: list[TreeRun]) -> int:
    if len(runs) == 1 and runs[0].label in (TREE_LABEL, "0002"):
        only = runs[0]
        count = sum(len(r) for r in only.races.values())
        if count:
            print(f"FAILED: {count} race(s) in the patched tree {only.tree}")
            return Exit.RACE
        print(f"ok: no race in {only.tree}")
        return Exit.OK
    differ = [
        f"{name} {report.step_label(r.label)}"
        for r in runs
        for name in report.SCENARIOS
        if report.cell_of(r.races[name]) != report.EXPECTED[name][r.label]
    ]
    if differ:
        print(f"FAILED: the measured table differs from the expected one in: {', '.join(differ)}")
        return Exit.RACE
    print("ok: the measured table is the expected one")
    return Exit.OK
