"""torch.cuda._sanitizer (CSAN), a private torch API, checked before use: a torch that
changed it stops the checker with a message instead of letting it silently see nothing."""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType

from patchset.errors import BackportError, Exit

# torch releases on which the race tables came out as expected (2.13.0: 0.5.18 on its own pins).
VERIFIED_TORCH = ("2.11.0", "2.13.0", "2.14.1")

# method -> parameter names (without self) that the checker calls it with
_LAUNCH = ("stream", "read_only", "read_write", "outputs", "operator", "tensor_aliases")
_HANDLER_METHODS: dict[str, tuple[str, ...]] = {
    "_handle_kernel_launch": _LAUNCH,
    "_handle_event_creation": ("event",),
    "_handle_event_record": ("event", "stream"),
    "_handle_event_wait": ("event", "stream"),
    "_handle_event_synchronization": ("event",),
    "_handle_stream_creation": ("stream",),
    "_handle_stream_synchronization": ("stream",),
    "_handle_device_synchronization": (),
    "_handle_memory_allocation": ("data_ptr",),
}
_ACCESS_FIELDS = {"type", "seq_num", "stream", "operator", "aliases", "is_output", "stack_trace"}
_ERROR_ATTRIBUTES = ("data_ptr", "current_access", "previous_access")


def torch_text(version: str) -> str:
    if version.split("+", 1)[0] in VERIFIED_TORCH:
        return f"torch {version} (verified)"
    return f"torch {version} (sanitizer API checked; table not yet verified on it)"


def load() -> ModuleType:
    """torch.cuda._sanitizer, once the shape of its API is the one the checker knows."""
    next_step = "use an interpreter whose torch is one of " + ", ".join(VERIFIED_TORCH)
    try:
        import torch
        from torch.cuda import _sanitizer as csan
    except ImportError as exc:
        problem = f"torch (or its torch.cuda._sanitizer) is not importable here ({exc})"
        raise BackportError(Exit.ENVIRONMENT, problem, next_step) from None
    if problems := check_shape(csan):
        raise BackportError(
            Exit.ENVIRONMENT,
            f"torch {torch.__version__}: torch.cuda._sanitizer changed shape; the race "
            "checker must be adapted before it can be trusted:\n  - " + "\n  - ".join(problems),
            next_step,
        )
    return csan


def check_shape(csan: ModuleType) -> list[str]:
    """What differs from the CSAN API the checker was written for (empty: nothing)."""
    handler = getattr(csan, "EventHandler", None)
    if handler is None:
        return ["EventHandler is gone"]
    problems: list[str] = []
    for name, params in _HANDLER_METHODS.items():
        method = getattr(handler, name, None)
        got = tuple(inspect.signature(method).parameters)[1:] if method else None
        if got is None:
            problems.append(f"EventHandler.{name} is gone")
        elif got != params:
            problems.append(f"EventHandler.{name}{got} instead of {params}")
    access = getattr(csan, "Access", None)
    if access is None or not dataclasses.is_dataclass(access):
        problems.append("Access is no longer a dataclass")
    elif missing := _ACCESS_FIELDS - {f.name for f in dataclasses.fields(access)}:
        problems.append(f"Access lacks {sorted(missing)}")
    error = getattr(csan, "UnsynchronizedAccessError", None)
    params = inspect.signature(error.__init__).parameters if error else {}
    if error is None:
        problems.append("UnsynchronizedAccessError is gone")
    elif lacking := [a for a in _ERROR_ATTRIBUTES if a not in params]:
        problems.append(f"UnsynchronizedAccessError lacks {lacking}")
    access_type = getattr(csan, "AccessType", None)
    if access_type is None or not {"READ", "WRITE"} <= set(access_type.__members__):
        problems.append("AccessType lacks READ/WRITE")
    if getattr(csan, "DEFAULT_STREAM_ID", None) != 0:
        problems.append("DEFAULT_STREAM_ID is no longer 0")
    return problems
