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

Some functions of the path import modules when they run (FutureMap's first
stash imports spec_utils). Imported then, after the window, such a module
would see is_cuda() True and import sgl_kernel. ``call_time_imports`` finds
them in the bytecode (IMPORT_NAME) of the path's functions and of the sglang
functions they call, and the window imports them too.

This is a test-rig technique on the real modules; nothing is stubbed.
"""

from __future__ import annotations

import ast
import dis
import importlib
import importlib.abc
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FunctionType, ModuleType

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
        # What the path imports inside its functions (FutureMap._lazy_init_forward_buf
        # imports spec_utils on the first stash): imported after the window, with
        # is_cuda() True, such a module would take its sgl_kernel branch.
        for name in sorted(set().union(*call_time_imports().values())):
            modules.setdefault(name, importlib.import_module(name))
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


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _is_package(name: str) -> bool:
    """Whether name is a package, found without importing it (its parents are imported)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.submodule_search_locations is not None


def imports_in(code: CodeType, package: str) -> set[str]:
    """The modules that the import statements inside code (and its nested code) name."""
    found: set[str] = set()
    for each in _codes(code):
        ops = list(dis.get_instructions(each))
        for k, op in enumerate(ops):
            if op.opname != "IMPORT_NAME":
                continue
            # compiled as LOAD_CONST level, LOAD_CONST fromlist, IMPORT_NAME name
            level, fromlist = ops[k - 2].argval, ops[k - 1].argval
            name = importlib.util.resolve_name("." * level + op.argval, package)
            found.add(name)
            if fromlist and _is_package(name):  # `from package import submodule`
                found |= {
                    f"{name}.{item}"
                    for item in fromlist
                    if item != "*" and importlib.util.find_spec(f"{name}.{item}") is not None
                }
    return found


def _sglang_function(obj: object) -> FunctionType | None:
    obj = inspect.unwrap(getattr(obj, "__func__", obj))  # type: ignore[arg-type]
    if isinstance(obj, FunctionType) and (obj.__module__ or "").startswith("sglang."):
        return obj
    return None


def _callees(func: FunctionType) -> list[FunctionType]:
    """sglang functions that func may call: its module's functions and classes (their
    __init__ and __post_init__) and its own class's methods, by the names it uses."""
    owner_name = func.__qualname__.rpartition(".")[0]
    owner = func.__globals__.get(owner_name.partition(".")[0]) if owner_name else None
    scopes = [func.__globals__, vars(owner) if isinstance(owner, type) else {}]
    found = []
    for code in _codes(func.__code__):
        for name in code.co_names:
            for scope in scopes:
                obj = scope.get(name)
                if isinstance(obj, type) and (obj.__module__ or "").startswith("sglang."):
                    found += [
                        f for m in ("__init__", "__post_init__")
                        if (f := _sglang_function(vars(obj).get(m)))
                    ]  # fmt: skip
                elif f := _sglang_function(obj):
                    found.append(f)
    return found


def call_time_imports() -> dict[str, set[str]]:
    """function -> the modules it imports when it runs, for every function of the path
    under test and every sglang function they call (transitively, by name), where any."""
    todo = [
        inspect.unwrap(_function(sys.modules[m], q))  # type: ignore[arg-type]
        for m, q in path_under_test()
    ]
    seen: dict[str, set[str]] = {}
    while todo:
        func = todo.pop()
        key = f"{func.__module__}.{func.__qualname__}"
        if key in seen:
            continue
        seen[key] = imports_in(func.__code__, func.__globals__.get("__package__") or "")
        todo += _callees(func)
    return {key: found for key, found in seen.items() if found}


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


class _NoSglKernel(importlib.abc.MetaPathFinder):
    """Makes sgl_kernel unimportable, as on a runner that has no sglang-kernel wheel."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "sgl_kernel":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def play_cuda() -> None:
    """Play, on a machine without a GPU, the CUDA machine the GPU stages run on.

    torch.cuda.is_available() answers True and the device is an H200's compute
    capability (9, 0), so sglang's is_cuda() is True as there; pinned host memory,
    which needs a driver, is plain host memory; sgl_kernel cannot be imported.
    Everything then imports as the lent machine imports it, and the rig runs the
    path under test on the CPU device with sglang's CUDA flags set. Nothing of
    sglang is changed. For one process only (the rehearsal's GPU stages set
    contract.PLAY_CUDA_ENV); CUDA work itself still needs a GPU.
    """
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # type: ignore[assignment]
    real_empty = torch.empty

    def empty(*args: object, pin_memory: bool = False, **kwargs: object) -> torch.Tensor:
        return real_empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    torch.empty = empty  # type: ignore[assignment]
    if not any(isinstance(f, _NoSglKernel) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoSglKernel())
    _clear_device_caches()
