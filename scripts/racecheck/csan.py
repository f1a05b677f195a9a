"""The private part of torch.cuda._sanitizer (CSAN) that the checker relies on.

CSAN is a private torch API. The checker uses its EventHandler (vector
clocks per stream, last-write/reads per data pointer) and the shape of the
errors it returns. Both are checked here before use, so that a torch upgrade
that changes them stops the checker with a clear message instead of letting
it silently see nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from types import ModuleType

# The torch release the checker was written and tested against.
TESTED_TORCH = "2.14.1"
# Set to 1 to try another torch release; the API shape is still checked.
UNTESTED_TORCH_ENV = "SGLANG_RACECHECK_ALLOW_UNTESTED_TORCH"

# method -> parameter names (without self) that the checker calls it with
_HANDLER_METHODS: dict[str, tuple[str, ...]] = {
    "_handle_kernel_launch": (
        "stream",
        "read_only",
        "read_write",
        "outputs",
        "operator",
        "tensor_aliases",
    ),
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


class CsanUnavailable(RuntimeError):
    """torch or its CUDA sanitizer is missing or not the shape the checker expects."""


def _torch_release(version: str) -> str:
    return version.split("+", 1)[0]


def load() -> ModuleType:
    """Import torch.cuda._sanitizer after checking torch's version and the API shape."""
    try:
        import torch
    except ImportError as exc:
        raise CsanUnavailable(f"torch is not importable here ({exc})") from None
    release = _torch_release(torch.__version__)
    if release != TESTED_TORCH and os.environ.get(UNTESTED_TORCH_ENV) != "1":
        raise CsanUnavailable(
            f"torch {torch.__version__} is not the release the race checker was tested "
            f"with ({TESTED_TORCH}); it relies on the private torch.cuda._sanitizer API. "
            f"Use the project venv (requirements pin torch=={TESTED_TORCH}), or set "
            f"{UNTESTED_TORCH_ENV}=1 to try this release anyway."
        )
    try:
        from torch.cuda import _sanitizer as csan
    except ImportError as exc:
        raise CsanUnavailable(f"torch.cuda._sanitizer cannot be imported ({exc})") from None
    problems = check_shape(csan)
    if problems:
        raise CsanUnavailable(
            f"torch {torch.__version__}: torch.cuda._sanitizer changed shape; the race "
            "checker must be adapted before it can be trusted:\n  - " + "\n  - ".join(problems)
        )
    return csan


def check_shape(csan: ModuleType) -> list[str]:
    """What differs from the CSAN API the checker was written for (empty: nothing)."""
    problems: list[str] = []
    handler = getattr(csan, "EventHandler", None)
    if handler is None:
        return ["EventHandler is gone"]
    for name, params in _HANDLER_METHODS.items():
        method = getattr(handler, name, None)
        if method is None:
            problems.append(f"EventHandler.{name} is gone")
            continue
        got = tuple(inspect.signature(method).parameters)[1:]
        if got != params:
            problems.append(f"EventHandler.{name}{got} instead of {params}")
    access = getattr(csan, "Access", None)
    if access is None or not dataclasses.is_dataclass(access):
        problems.append("Access is no longer a dataclass")
    else:
        missing = _ACCESS_FIELDS - {f.name for f in dataclasses.fields(access)}
        if missing:
            problems.append(f"Access lacks {sorted(missing)}")
    error = getattr(csan, "UnsynchronizedAccessError", None)
    if error is None:
        problems.append("UnsynchronizedAccessError is gone")
    else:
        params = inspect.signature(error.__init__).parameters
        missing_attrs = [a for a in _ERROR_ATTRIBUTES if a not in params]
        if missing_attrs:
            problems.append(f"UnsynchronizedAccessError lacks {missing_attrs}")
    access_type = getattr(csan, "AccessType", None)
    if access_type is None or not {"READ", "WRITE"} <= set(access_type.__members__):
        problems.append("AccessType lacks READ/WRITE")
    if getattr(csan, "DEFAULT_STREAM_ID", None) != 0:
        problems.append("DEFAULT_STREAM_ID is no longer 0")
    return problems
