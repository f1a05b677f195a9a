"""Import the sglang modules under test on a CUDA machine without sgl_kernel (it cannot travel
to an offline runner): with CUDA hidden, then the path's CUDA flags restored (docs/gpu.md)."""

import ast
import dis
import functools
import importlib.abc
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterator
from types import CodeType, FunctionType, ModuleType

import torch

# The modules the GPU test and the benchmark use; a trailing "?": only some releases have it.
MODULES = (
    "sglang.srt.disaggregation.decode",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.runtime_context?",  # 0.5.13 has none
    "sglang.srt.speculative.eagle_disaggregation",
    "sglang.srt.speculative.spec_info",
)

# What the S1 rig and the benchmark run, as module:qualified name. RelayPayload came with
# 0.5.15, the DSA top-k relay buffer with 0.5.15.post1, stash's n-gram buffers with 0.5.18.
PATH_UNDER_TEST = (
    "sglang.srt.managers.overlap_utils:FutureMap.__init__",
    "sglang.srt.managers.overlap_utils:FutureMap._lazy_init_forward_buf",
    "sglang.srt.managers.overlap_utils:FutureMap._maybe_init_dsa_topk_indices_buf?",
    "sglang.srt.managers.overlap_utils:FutureMap._maybe_init_ngram_bufs?",
    "sglang.srt.managers.overlap_utils:FutureMap.publish",
    "sglang.srt.managers.overlap_utils:FutureMap.stash",
    "sglang.srt.managers.overlap_utils:RelayPayload.from_draft_input?",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
    "sglang.srt.disaggregation.decode_schedule_batch_mixin:"
    "ScheduleBatchDisaggregationDecodeMixin.process_prebuilt",
    "sglang.srt.speculative.eagle_disaggregation:build_eagle_disagg_draft_input",
    "sglang.srt.speculative.eagle_info:EagleDraftInput.__post_init__",
    "sglang.srt.mem_cache.memory_pool:ReqToTokenPool.__init__",
)

# Module-level flags re-evaluated after the import, by name -> the check that sets them.
RESTORED = {"_is_cuda": "is_cuda", "_is_cuda_alike": "is_cuda_alike"}

# Calls and names whose value depends on whether CUDA is visible.
_CUDA_DEPENDENT = re.compile(
    r"^(_?is_cuda\w*|get_device_sm|get_device_capability|get_device_name|device_count"
    r"|is_available|is_sm\d+\w*|is_blackwell\w*|is_hopper\w*|current_platform)$"
)


def _clear_device_caches() -> None:
    if common := sys.modules.get("sglang.srt.utils.common"):
        for name in set(RESTORED.values()):
            getattr(common, name).cache_clear()


def import_modules() -> dict[str, ModuleType]:
    """The modules, imported with CUDA hidden, their call-time CUDA flags restored."""
    modules: dict[str, ModuleType] = {}
    real = torch.cuda.is_available
    _clear_device_caches()
    torch.cuda.is_available = lambda: False  # type: ignore[assignment]
    try:
        for entry in (*MODULES, *(entry.partition(":")[0] for entry in PATH_UNDER_TEST)):
            name = entry.removesuffix("?")
            try:
                modules.setdefault(name, importlib.import_module(name))
            except ModuleNotFoundError as err:
                if not entry.endswith("?") or err.name != name:
                    raise
        # Imported after the window, with is_cuda() True, what the path imports inside
        # its functions would take its sgl_kernel branch.
        for name in sorted(set().union(*call_time_imports().values())):
            modules.setdefault(name, importlib.import_module(name))
    finally:
        torch.cuda.is_available = real  # type: ignore[assignment]
        _clear_device_caches()
    from sglang.srt.utils import common

    for module in modules.values():
        for flag, check in RESTORED.items():
            if flag in vars(module):
                setattr(module, flag, getattr(common, check)())
    return modules


def cuda_flags_of(module: ModuleType) -> set[str]:
    """Module-level names whose import-time value depends on whether CUDA is visible."""
    flags: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom):
            # a value bound at import; an imported check function is called later
            flags |= {a.asname or a.name for a in node.names if a.name == "current_platform"}
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_mentions_cuda(n, flags) for n in ast.walk(node.value)):
                flags |= {t.id for t in targets if isinstance(t, ast.Name)}
    return flags


def _mentions_cuda(node: ast.AST, flags: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return bool(_CUDA_DEPENDENT.match(node.id)) or node.id in flags
    return isinstance(node, ast.Attribute) and bool(_CUDA_DEPENDENT.match(node.attr))


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def cuda_flags_read() -> dict[str, set[str]]:
    """function -> the import-time CUDA flags of its module that it reads."""
    return {
        f"{module}.{qualname}": cuda_flags_of(importlib.import_module(module))
        & {name for code in _codes(func.__code__) for name in code.co_names}
        for (module, qualname), func in path_under_test().items()
    }


def _is_package(name: str) -> bool:
    try:  # found without importing it
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.submodule_search_locations is not None


def imports_in(code: CodeType, package: str) -> set[str]:
    """The modules that the import statements inside code (and its nested code) name."""
    found: set[str] = set()
    for each in _codes(code):
        ops = list(dis.get_instructions(each))
        for k in [k for k, op in enumerate(ops) if op.opname == "IMPORT_NAME"]:
            # compiled as LOAD_CONST level, LOAD_CONST fromlist, IMPORT_NAME name
            level, fromlist = ops[k - 2].argval, ops[k - 1].argval
            name = importlib.util.resolve_name("." * level + ops[k].argval, package)
            found.add(name)
            if fromlist and _is_package(name):  # `from package import submodule`
                subs = (f"{name}.{item}" for item in fromlist if item != "*")
                found |= {s for s in subs if importlib.util.find_spec(s) is not None}
    return found


def _sglang_function(obj: object) -> FunctionType | None:
    obj = inspect.unwrap(getattr(obj, "__func__", obj))  # type: ignore[arg-type]
    if isinstance(obj, FunctionType) and (obj.__module__ or "").startswith("sglang."):
        return obj
    return None


def _callees(func: FunctionType) -> list[FunctionType]:
    """sglang functions func may call by name (of its module, its classes' inits, its class)."""
    owner = func.__globals__.get(func.__qualname__.partition(".")[0])  # a method's class
    scopes = [func.__globals__, vars(owner) if isinstance(owner, type) else {}]
    found = []
    for code in _codes(func.__code__):
        for obj in (scope.get(name) for name in code.co_names for scope in scopes):
            if isinstance(obj, type) and (obj.__module__ or "").startswith("sglang."):
                inits = [vars(obj).get(m) for m in ("__init__", "__post_init__")]
                found += [f for f in map(_sglang_function, inits) if f]
            elif f := _sglang_function(obj):
                found.append(f)
    return found


def call_time_imports() -> dict[str, set[str]]:
    """function -> the modules it imports when it runs, for the path under test and its callees."""
    todo = list(path_under_test().values())
    seen: dict[str, set[str]] = {}
    while todo:
        func = todo.pop()
        key = f"{func.__module__}.{func.__qualname__}"
        if key not in seen:
            seen[key] = imports_in(func.__code__, func.__globals__.get("__package__") or "")
            todo += _callees(func)
    return {key: found for key, found in seen.items() if found}


def path_under_test() -> dict[tuple[str, str], FunctionType]:
    """(module, qualname) -> function; AttributeError where a non-"?" one is gone."""
    present = {}
    for entry in PATH_UNDER_TEST:
        module_name, _, qualname = entry.removesuffix("?").partition(":")
        module = importlib.import_module(module_name)
        try:
            obj = functools.reduce(getattr, qualname.split("."), module)
        except AttributeError:
            if entry.endswith("?"):
                continue
            raise
        present[module_name, qualname] = inspect.unwrap(getattr(obj, "__func__", obj))
    return present


class _NoSglKernel(importlib.abc.MetaPathFinder):
    """Makes sgl_kernel unimportable, as on a runner that has no sglang-kernel wheel."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "sgl_kernel":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def play_cuda() -> None:
    """A rehearsal plays the H200: CUDA at capability (9, 0), no pinned memory, no sgl_kernel."""
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # type: ignore[assignment]
    real_empty = torch.empty

    def empty(*args: object, pin_memory: bool = False, **kwargs: object) -> torch.Tensor:
        return real_empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    torch.empty = empty  # type: ignore[assignment]
    if not any(isinstance(f, _NoSglKernel) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoSglKernel())
    _clear_device_caches()
