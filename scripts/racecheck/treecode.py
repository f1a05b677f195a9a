"""What the scenarios take from the tree under test (server args, WAR barrier), per release."""

import ast
import contextlib
import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

EAGLE_TOPK = 1  # the draft's top-k in every scenario
_IMPORTED = "imported from sglang.srt.managers.scheduler"


class ScenarioError(RuntimeError):
    """The sglang tree did not behave as a scenario needs (not a race)."""


def stand_in_server_args(spec: str | None, hisparse: bool = False) -> Any:
    """The few server arguments the relay reads; from 0.5.18 on, a ServerArgs of its defaults."""
    values = {
        "speculative_algorithm": spec,
        "enable_hisparse": hisparse,
        "speculative_eagle_topk": EAGLE_TOPK,
        "speculative_num_steps": 1,
        "enable_multi_layer_eagle": False,
        "disaggregation_decode_enable_radix_cache": False,
        "enable_deterministic_inference": False,
        "enable_custom_logit_processor": False,
    }
    try:
        from sglang.srt.arg_groups.arg_utils import namespace_of  # noqa: F401
    except ImportError:  # releases before the config bags
        return SimpleNamespace(**values)
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)  # config bags need every field; no __post_init__
    for f in dataclasses.fields(ServerArgs):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        object.__setattr__(args, f.name, None if value is dataclasses.MISSING else value)
    for name, value in values.items():
        object.__setattr__(args, name, value)
    return args


@contextlib.contextmanager
def server_args_published(args: Any) -> Iterator[None]:
    """args as the process-wide server args (the runtime context, else a module global) while
    the block runs; those published before (a test session's) come back after it."""
    try:
        from sglang.srt.runtime_context import get_context, reset_context

        holder: Any = get_context()
    except ImportError:  # 0.5.13 has no runtime context
        holder = None
    if hasattr(holder, "set_server_args"):
        names = getattr(type(holder), "__slots__", None) or list(vars(holder))
        saved = {name: getattr(holder, name) for name in names if hasattr(holder, name)}
        reset_context()
        get_context().set_server_args(args)
    else:
        from sglang.srt import server_args as holder

        saved = {"_global_server_args": holder._global_server_args}
        holder.set_global_server_args_for_scheduler(args)
    try:
        yield
    finally:
        for name, value in saved.items():
            object.__setattr__(holder, name, value)


class Barrier(NamedTuple):  # the WAR barrier, function(scheduler), as the decode loop runs it
    function: Callable[..., None]
    scheduler: Any
    runner_attr: str  # model_worker's runner whose read-done event the fast path consumes
    event_attr: str  # that event's attribute of the runner ("" without a fast path: 0.5.13)
    how: str  # where the function came from


@functools.cache
def war_barrier_of_tree() -> Barrier:
    """Scheduler._apply_war_barrier (0.5.14 on), else the decode loop's inline one."""
    function, how = scheduler_method("_apply_war_barrier")
    how = f"Scheduler._apply_war_barrier {how}"
    scheduler: Any = SimpleNamespace()
    if function is None:
        function, how = _inline_barrier()
    elif how.endswith(_IMPORTED):
        from sglang.srt.managers.scheduler import Scheduler

        scheduler = Scheduler.__new__(Scheduler)
    runners, events = (
        [name for name in function.__code__.co_names if name.endswith(suffix)]
        for suffix in ("_runner", "read_done_event")
    )
    if len(runners) > 1 or len(runners) != len(events):
        raise ScenarioError(
            f"the WAR barrier reads runners {runners} and events {events}; the loop "
            "scenarios model one runner with one read-done event, or none"
        )
    if not events:
        how += (
            "; no read-done fast path in this release: the fast configuration "
            "waits on the whole forward stream, as the fallback does"
        )
    return Barrier(function, scheduler, "".join(runners), "".join(events), how)


@functools.cache
def scheduler_method(name: str) -> tuple[Callable[..., Any] | None, str]:
    """Scheduler.<name> (None: the release has none) and how it was got; where scheduler.py
    does not import on the CPU, compiled from its source with what its imports bind."""
    try:
        from sglang.srt.managers.scheduler import Scheduler
    except Exception as err:  # the scheduler module needs more than the relay does
        source = sglang_root() / "srt" / "managers" / "scheduler.py"
        module = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        found = [
            node
            for cls in module.body
            if isinstance(cls, ast.ClassDef) and cls.name == "Scheduler"
            for node in cls.body
            if isinstance(node, ast.FunctionDef) and node.name == name
        ]
        reason = f"{type(err).__name__}: {err}"
        how = f"compiled from scheduler.py's source (the module does not import here: {reason})"
        if not found:
            return None, how
        return _compiled(found[0], source, _imports_used(module, found[0])), how
    return getattr(Scheduler, name, None), _IMPORTED


def _imports_used(module: ast.Module, function: ast.FunctionDef) -> dict[str, Any]:
    """What the module's top-level imports bind, for the names function reads."""
    used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    namespace: dict[str, Any] = {}
    for node in ast.walk(module):
        if not isinstance(node, ast.Import | ast.ImportFrom) or getattr(node, "level", 0):
            continue
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if bound in used and isinstance(node, ast.ImportFrom):
                namespace[bound] = getattr(importlib.import_module(node.module), alias.name)
            elif bound in used:
                namespace[bound] = importlib.import_module(alias.name if alias.asname else bound)
    return namespace


def _inline_barrier() -> tuple[Callable[..., None], str]:
    """event_loop_overlap_disagg_decode's `if self._war_barrier_enabled:`, compiled."""
    source = sglang_root() / "srt" / "disaggregation" / "decode.py"
    module = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    found = [
        node
        for loop in ast.walk(module)
        if isinstance(loop, ast.FunctionDef) and loop.name == "event_loop_overlap_disagg_decode"
        for node in ast.walk(loop)
        if isinstance(node, ast.If)
        and any(
            isinstance(n, ast.Attribute) and n.attr == "_war_barrier_enabled"
            for n in ast.walk(node.test)
        )
    ]
    if len(found) != 1:
        raise ScenarioError(
            "the tree has no Scheduler._apply_war_barrier, and event_loop_overlap_disagg_decode "
            f"holds {len(found)} `if self._war_barrier_enabled` statements instead of one"
        )
    wrapper = ast.parse("def _apply_war_barrier(self): pass").body[0]
    assert isinstance(wrapper, ast.FunctionDef)
    wrapper.body = found
    ast.copy_location(wrapper, found[0])
    how = (
        f"inline in event_loop_overlap_disagg_decode (decode.py:{found[0].lineno}), "
        "compiled from the source; the release has no Scheduler._apply_war_barrier"
    )
    from sglang.srt.disaggregation import decode

    return _compiled(wrapper, source, vars(decode)), how


def _compiled(function: ast.FunctionDef, source: Path, names: dict[str, Any]) -> Callable[..., Any]:
    namespace = dict(names)
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(source), "exec"), namespace)
    return namespace[function.name]


def sglang_root() -> Path:
    import sglang

    return Path(sglang.__file__).resolve().parent
