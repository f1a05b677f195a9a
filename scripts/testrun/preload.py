"""The heavy third-party part of sglang's import closure, imported once before forking.

Both the step-suite worker and the race checker import these in a parent
process and fork one child per sglang tree, so each tree pays only for its own
sglang modules. Only a speed-up: a module that is missing is skipped, and the
child then meets (and reports) whatever sglang itself cannot import.
"""

from __future__ import annotations

import importlib
import time

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
)


def preload() -> float:
    """Import what of PRELOAD is importable; the seconds it took."""
    started = time.perf_counter()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            continue
    return time.perf_counter() - started
