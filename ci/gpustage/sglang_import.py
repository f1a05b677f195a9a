"""Import the sglang modules under test on a CUDA machine that has no sgl_kernel.

sglang decides at import time whether it runs on CUDA:
``sglang.srt.utils.common.is_cuda()`` is ``torch.cuda.is_available() and
torch.version.cuda`` (cached), and dozens of modules of the import closure
branch on it at module level (``if _is_cuda: from sgl_kernel import ...``).
sgl_kernel (the sglang-kernel wheel, about 615 MB) cannot travel to an offline
runner, so the GPU tests import the modules with ``torch.cuda.is_available``
answering False for the duration of the import only. Afterwards the real
function is back, sglang's cached device checks are cleared, and the CUDA
flags that the path under test reads at call time (``_is_cuda`` of
overlap_utils and memory_pool) are evaluated again, so those modules hold the
value a production CUDA import gives them.

What differs from a production CUDA import: the module-level branches of the
rest of the closure (quantization, attention, MoE layers, ...) took their
non-CUDA arm, i.e. kernels from sgl_kernel are not bound. The path under test
(PATH_UNDER_TEST) calls none of them: it writes relay rows with tensor
indexing and takes streams and events from ``torch.get_device_module(device)``
at call time. ``cuda_flags_read`` proves per step that these functions read
no import-time CUDA flag other than the ones restored here.

This is a test-rig technique on the real modules; nothing is stubbed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, ModuleType

import torch

# The modules the GPU test and the benchmark use.
MODULES = (
    "sglang.srt.disaggregation.decode",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.runtime_context",
    "sglang.srt.speculative.eagle_disaggregation",
    "sglang.srt.speculative.spec_info",
)

# Modules of MODULES that only some releases have: 0.5.13 has no runtime context.
OPTIONAL_MODULES = frozenset({"sglang.srt.runtime_context"})

# What the S1 rig and the benchmark run: (module, qualified name).
PATH_UNDER_TEST = (
    ("sglang.srt.managers.overlap_utils", "FutureMap.__init__"),
    ("sglang.srt.managers.overlap_utils", "FutureMap._lazy_init_forward_buf"),
    ("sglang.srt.managers.overlap_utils", "FutureMap._maybe_init_dsa_topk_indices_buf"),
    ("sglang.srt.managers.overlap_utils", "FutureMap._maybe_init_ngram_bufs"),
    ("sglang.srt.managers.overlap_utils", "FutureMap.publish"),
    ("sglang.srt.managers.overlap_utils", "FutureMap.stash"),
    ("sglang.srt.managers.overlap_utils", "RelayPayload.from_draft_input"),
    (
        "sglang.srt.disaggregation.decode",
        "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
    ),
    (
        "sglang.srt.disaggregation.decode_schedule_batch_mixin",
        "ScheduleBatchDisaggregationDecodeMixin.process_prebuilt",
    ),
    ("sglang.srt.speculative.eagle_disaggregation", "build_eagle_disagg_draft_input"),
    ("sglang.srt.speculative.eagle_info", "EagleDraftInput.__post_init__"),
    ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.__init__"),
)

# Functions of PATH_UNDER_TEST that only some releases have; where one is
# missing the path does not run it. RelayPayload came with 0.5.15 (before it,
# stash takes the token tensor or the draft input itself), the DSA top-k relay
# buffer with 0.5.15.post1 and stash's n-gram buffers with 0.5.18.
OPTIONAL_FUNCTIONS = frozenset(
    {
        ("sglang.srt.managers.overlap_utils", "FutureMap._maybe_init_dsa_topk_indices_buf"),
        ("sglang.srt.managers.overlap_utils", "FutureMap._maybe_init_ngram_bufs"),
        ("sglang.srt.managers.overlap_utils", "RelayPayload.from_draft_input"),
    }
)

# Module-level flags re-evaluated after the import, by name -> the check that sets them.
RESTORED = {"_is_cuda": "is_cuda", "_is_cuda_alike": "is_cuda_alike"}

# Calls and names whose value depends on whether CUDA is visible.
_CUDA_DEPENDENT = re.compile(
    r"^(_?is_cuda\w*|get_device_sm|get_device_capability|get_device_name|device_count"
    r"|is_available|is_sm\d+\w*|is_blackwell\w*|is_hopper\w*|current_platform)$"
)


@contextmanager
def cuda_hidden() -> Iterator[None]:
    """torch.cuda.is_available() answers False inside; sglang's cached checks are cleared."""
    real = torch.cuda.is_available
    _clear_device_caches()
    torch.cuda.is_available = lambda: False  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.is_available = real  # type: ignore[assignment]
        _clear_device_caches()


def _clear_device_caches() -> None:
    common = sys.modules.get("sglang.srt.utils.common")
    if common is None:
        return
    for name in set(RESTORED.values()):
        getattr(common, name).cache_clear()


def import_modules(names: tuple[str, ...] = MODULES) -> dict[str, ModuleType]:
    """The modules, imported with CUDA hidden, their call-time CUDA flags restored."""
    modules: dict[str, ModuleType] = {}
    with cuda_hidden():
        for name in names:
            try:
                modules[name] = importlib.import_module(name)
            except ModuleNotFoundError as err:
                if name not in OPTIONAL_MODULES or err.name != name:
                    raise
        for module_name, _ in PATH_UNDER_TEST:
            if module_name not in modules:
                modules[module_name] = importlib.import_module(module_name)
    from sglang.srt.utils import common

    for module in modules.values():
        for flag, check in RESTORED.items():
            if flag in vars(module):
                setattr(module, flag, getattr(common, check)())
    return modules


def cuda_flags_of(module: ModuleType) -> set[str]:
    """Module-level names whose import-time value depends on whether CUDA is visible."""
    tree = ast.parse(inspect.getsource(module))
    flags: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            # a value bound at import; an imported check function is called later
            flags |= {a.asname or a.name for a in node.names if a.name == "current_platform"}
            continue
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        if any(_mentions_cuda(n, flags) for n in ast.walk(node.value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flags |= {t.id for t in targets if isinstance(t, ast.Name)}
    return flags


def _mentions_cuda(node: ast.AST, flags: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return bool(_CUDA_DEPENDENT.match(node.id)) or node.id in flags
    if isinstance(node, ast.Attribute):
        return bool(_CUDA_DEPENDENT.match(node.attr))
    return False


def _names(code: CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names(const)
    return names


def cuda_flags_read() -> dict[str, set[str]]:
    """function -> the import-time CUDA flags of its module that it reads."""
    found: dict[str, set[str]] = {}
    for module_name, qualname in path_under_test():
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        func = inspect.unwrap(_function(module, qualname))
        found[f"{module_name}.{qualname}"] = _names(func.__code__) & cuda_flags_of(module)
    return found


def _function(module: ModuleType, qualname: str) -> object:
    obj: object = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__func__", obj)


def path_under_test() -> list[tuple[str, str]]:
    """PATH_UNDER_TEST as this release has it: an optional function it lacks is left out.

    A missing function that is not optional raises AttributeError: the path
    changed and the rig (and this list) must follow it.
    """
    present = []
    for module_name, qualname in PATH_UNDER_TEST:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        try:
            _function(module, qualname)
        except AttributeError:
            if (module_name, qualname) in OPTIONAL_FUNCTIONS:
                continue
            raise
        present.append((module_name, qualname))
    return present
