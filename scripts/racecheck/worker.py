"""Every scenario on sglang trees, one forked child per tree (a process imports one
sglang): each pickles its result, or {"code", "error", "next_step"}, into a temporary
folder, with what it printed beside it."""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from treefork import fork_each, preload, use_tree

from . import csan
from .catalogue import SCENARIOS
from .report import TreeRun


def _run(tree: Path) -> dict[str, Any]:
    started = time.perf_counter()
    use_tree(tree)
    try:
        import sglang.srt.disaggregation.decode  # noqa: F401
    except Exception as err:  # any import failure of the tree is reported, not raised
        hint = ""
        if isinstance(err, ModuleNotFoundError):
            hint = (
                "use an interpreter with sglang's import closure (build/venv from "
                "scripts/run-tests, or --python PATH)"
            )
        return _error(Exit.SCENARIO, f"importing sglang failed: {_short(err)}", hint)
    import torch

    from . import scenarios, treecode

    root, expected = scenarios.sglang_root(), (tree / "python" / "sglang").resolve()
    if root != expected:
        return _error(
            Exit.ENVIRONMENT,
            f"sglang was imported from {root}, not from {expected}; another "
            "sglang (an installed package?) shadows the tree",
            "use an interpreter without sglang installed (build/venv, or --python PATH)",
        )
    imported = time.perf_counter()
    races = {}
    for name in SCENARIOS:
        try:
            races[name] = scenarios.run(name).races
        except Exception as err:  # the tree's API differs from what the scenario drives
            return _error(Exit.SCENARIO, f"scenario {name} could not run: {_short(err)}")
    return {
        "torch": torch.__version__,
        "barrier": treecode.war_barrier_of_tree().how,
        "import_s": round(imported - started, 2),
        "run_s": round(time.perf_counter() - imported, 3),
        "races": races,
    }


def _error(code: Exit, problem: str, next_step: str = "") -> dict[str, Any]:
    return {"code": int(code), "error": problem, "next_step": next_step}


def _short(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def run_trees(runs: list[TreeRun]) -> float:
    """Every tree's scenarios into its run; the seconds the third-party preload took."""
    csan.load()  # a torch whose sanitizer changed shape is refused before anything runs
    preload_s = preload()

    def announce(n: int) -> None:
        print(f"race-check: {len(SCENARIOS)} scenarios on {runs[n].label} ({runs[n].tree})")

    with tempfile.TemporaryDirectory(prefix="race-check-") as tmp:
        outs = [Path(tmp) / f"{n}.pickle" for n in range(len(runs))]
        # More children than cores would only share them and hold more memory.
        jobs, slots = range(len(runs)), os.cpu_count() or 1
        fork_each(jobs, slots, lambda n: _child(runs[n].tree, outs[n]), announce)
        results = [_result(out) for out in outs]
    for run, result in zip(runs, results, strict=True):
        if "error" in result:
            if result["code"] == Exit.INTERNAL:
                print(result["error"], file=sys.stderr)
                raise RuntimeError(f"the checker failed on {run.tree} (the trace above)")
            problem = f"{run.label} ({run.tree}): {result['error']}"
            raise BackportError(Exit(result["code"]), problem, result["next_step"])
        for key in ("races", "torch", "barrier", "import_s", "run_s"):
            setattr(run, key, result[key])
    return preload_s


def _child(tree: Path, out: Path) -> int:
    # What the tree's imports print (warnings, mostly) is not the checker's report.
    log = os.open(out.with_suffix(".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        result = _run(tree)
    except BaseException:
        result = _error(Exit.INTERNAL, traceback.format_exc())
    out.write_bytes(pickle.dumps(result))
    return 0


def _result(out: Path) -> dict[str, Any]:
    """What the child wrote, or what it printed if it ended without writing it."""
    if out.is_file():
        return pickle.loads(out.read_bytes())
    log = out.with_suffix(".log")
    printed = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return _error(
        Exit.ENVIRONMENT,
        "its process ended without a result:\n" + "\n".join(printed[-15:]),
        "check that this interpreter imports torch, or pass --python PATH",
    )
