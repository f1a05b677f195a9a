"""The heavy third-party part of sglang's import closure, imported once before forking.

Both the step-suite worker and the race checker import these in a parent
process and fork one child per sglang tree, so each tree pays only for its own
sglang modules. Only a speed-up: a module that is missing is skipped, and the
child then meets (and reports) whatever sglang itself cannot import.
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
from pathlib import Path

from patchset import paths

PRELOAD = (
    "torch",
    "torch._inductor.lowering",
    "torch._inductor.compile_fx",
    "torch._functorch.aot_autograd",
    "torchvision",
    "torchvision.transforms.v2",
    "triton",
    "numpy",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.processing_utils",
    "transformers.models.auto.processing_auto",
    "transformers.models.auto.tokenization_auto",
    "openai",
    "networkx",
    "compressed_tensors",
    "aiohttp.web",
    "starlette",
    "IPython",
    "pydantic",
    "requests",
    "xgrammar",
    "zmq",
    "gguf",
    "msgspec",
    "orjson",
    "einops",
    # Not sglang's: the test runner every forked child of a worker or a
    # testrun.forkserver starts.
    "pytest",
    "_pytest.junitxml",
)


_took: float | None = None


def preload() -> float:
    """Import what of PRELOAD is importable, then freeze it; the seconds it took.

    Done once per process: a later call (or one in a child forked from a
    testrun.forkserver) returns the seconds the first one took.

    gc.freeze() moves the millions of objects these imports made out of the
    collector's reach: a forked child's collections (pytest runs several as
    it ends) would otherwise walk them all, about half a second each, and copy
    every page they touch.
    """
    global _took
    if _took is not None:
        return _took
    started = time.perf_counter()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            continue
    gc.collect()
    gc.freeze()
    _took = time.perf_counter() - started
    return _took


def use_tree(tree: Path) -> None:
    """Put tree/python first on sys.path, for a forked child about to import its sglang.

    A tree in the project's build folder (a step tree) is ours, so its compiled
    bytecode is kept there even where PYTHONDONTWRITEBYTECODE is set: without
    it each run compiles about a thousand modules again (close to 2 s). Any
    other tree (--tree) keeps the interpreter's setting.
    """
    sys.path.insert(0, str(tree / "python"))
    if tree.resolve().is_relative_to(paths.build_dir().resolve()):
        sys.dont_write_bytecode = False
