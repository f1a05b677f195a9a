"""Import sglang's third-party closure once, then fork one child per sglang tree (a process
holds one sglang); a module the preload misses, the child imports (or reports) itself."""

import contextlib
import functools
import gc
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from patchset import paths

# The last line's are the test runner every child of testrun.worker starts.
PRELOAD = """
    torch torch._inductor.lowering torch._inductor.compile_fx torch._functorch.aot_autograd
    torchvision torchvision.transforms.v2 triton numpy
    transformers transformers.modeling_utils transformers.generation
    transformers.processing_utils transformers.models.auto.processing_auto
    transformers.models.auto.tokenization_auto
    openai networkx compressed_tensors aiohttp.web starlette IPython pydantic requests
    xgrammar zmq gguf msgspec orjson einops
    pytest _pytest.junitxml
"""
Job = TypeVar("Job")


@functools.cache
def preload() -> float:
    """Import what of PRELOAD is importable and freeze it, once; the seconds it took."""
    started = time.perf_counter()
    for name in PRELOAD.split():
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()  # else each forked child's collections walk these millions of objects
    return time.perf_counter() - started


def use_tree(tree: Path) -> None:
    """Put tree/python first on sys.path; a step tree (ours, under build/) keeps its
    bytecode even with PYTHONDONTWRITEBYTECODE, else each run compiles it all again."""
    sys.path.insert(0, str(tree / "python"))
    if tree.resolve().is_relative_to(paths.build_dir().resolve()):
        sys.dont_write_bytecode = False


def fork_each(
    jobs: Sequence[Job],
    slots: int,
    child: Callable[[Job], int],
    started: Callable[[Job], None],
    ended: Callable[[Job, int, float], None] | None = None,
) -> None:
    """child(job) forked per job, slots at a time; interrupted, the children are ended."""
    pending = list(jobs)
    running: dict[int, tuple[Job, float]] = {}
    try:
        while pending or running:
            while pending and len(running) < max(1, slots):
                job = pending.pop(0)
                started(job)
                running[_fork(child, job)] = (job, time.monotonic())
            pid, status = os.wait()
            job, since = running.pop(pid)
            if ended:
                ended(job, os.waitstatus_to_exitcode(status), time.monotonic() - since)
    finally:
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in running:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _fork(child: Callable[[Job], int], job: Job) -> int:
    code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what this process has buffered is written once, by this process
    if pid := os.fork():
        return pid
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        code = child(job)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
