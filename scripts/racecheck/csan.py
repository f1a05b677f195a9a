"""torch.cuda._sanitizer (CSAN), a private API checked before use (a changed one must stop
the checker, not blind it); simulated streams and events feed its clocks on the CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

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
DEFAULT_STREAM_ID = 0  # CSAN knows stream 0 from the start; check_shape pins the value
_UNMODELLED = "completion is not modelled; the checker only knows order"


def torch_text(version: str) -> str:
    if version.split("+", 1)[0] in VERIFIED_TORCH:
        return f"torch {version} (verified)"
    return f"torch {version} (sanitizer API checked; table not yet verified on it)"


def load() -> ModuleType:
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
        if method is None:
            problems.append(f"EventHandler.{name} is gone")
        elif (got := tuple(inspect.signature(method).parameters)[1:]) != params:
            problems.append(f"EventHandler.{name}{got} instead of {params}")
    access = getattr(csan, "Access", None)
    if not dataclasses.is_dataclass(access):
        problems.append("Access is no longer a dataclass")
    elif missing := _ACCESS_FIELDS - {f.name for f in dataclasses.fields(access)}:
        problems.append(f"Access lacks {sorted(missing)}")
    error = getattr(csan, "UnsynchronizedAccessError", None)
    if error is None:
        problems.append("UnsynchronizedAccessError is gone")
    elif lacking := [a for a in _ERROR_ATTRIBUTES if a not in inspect.signature(error).parameters]:
        problems.append(f"UnsynchronizedAccessError lacks {lacking}")
    access_type = getattr(csan, "AccessType", None)
    if access_type is None or not {"READ", "WRITE"} <= set(access_type.__members__):
        problems.append("AccessType lacks READ/WRITE")
    if getattr(csan, "DEFAULT_STREAM_ID", None) != DEFAULT_STREAM_ID:
        problems.append("DEFAULT_STREAM_ID is no longer 0")
    return problems


class SimEvent:
    def __init__(self, device: SimDevice, **_options: Any) -> None:
        self.device = device
        self.event_id = next(device._ids)
        device.handler._handle_event_creation(self.event_id)

    def record(self, stream: SimStream | None = None) -> None:
        stream = stream or self.device.current_stream()
        self.device.handler._handle_event_record(self.event_id, stream.stream_id)

    def wait(self, stream: SimStream | None = None) -> None:
        stream = stream or self.device.current_stream()
        self.device.handler._handle_event_wait(self.event_id, stream.stream_id)

    def synchronize(self) -> None:
        self.device.handler._handle_event_synchronization(self.event_id)

    def query(self) -> bool:
        raise NotImplementedError(f"SimEvent.query(): {_UNMODELLED}")


@dataclasses.dataclass(eq=False)
class SimStream:
    device: SimDevice
    name: str
    stream_id: int

    def wait_event(self, event: SimEvent) -> None:
        event.wait(self)

    def wait_stream(self, stream: SimStream) -> None:
        self.wait_event(stream.record_event())  # as torch.cuda.Stream.wait_stream does

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event or SimEvent(self.device)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.device.handler._handle_stream_synchronization(self.stream_id)

    def query(self) -> bool:
        raise NotImplementedError(f"SimStream.query(): {_UNMODELLED}")


class SimDevice:  # stands in for torch.cuda as returned by torch.get_device_module()
    def __init__(self) -> None:
        self.handler = load().EventHandler()
        self._ids = itertools.count(DEFAULT_STREAM_ID + 1)
        self._default = self._current = SimStream(self, "default stream", DEFAULT_STREAM_ID)
        self.streams: dict[int, SimStream] = {DEFAULT_STREAM_ID: self._default}

    def Stream(self, name: str | None = None, **_options: Any) -> SimStream:
        stream_id = next(self._ids)
        self.handler._handle_stream_creation(stream_id)
        self.streams[stream_id] = SimStream(self, name or f"stream {stream_id}", stream_id)
        return self.streams[stream_id]

    def Event(self, **options: Any) -> SimEvent:
        return SimEvent(self, **options)

    def current_stream(self, device: Any = None) -> SimStream:
        return self._current

    def default_stream(self, device: Any = None) -> SimStream:
        return self._default

    def set_stream(self, stream: SimStream) -> None:
        self._current = stream

    @contextlib.contextmanager
    def stream(self, stream: SimStream | None) -> Iterator[None]:
        previous = self._current
        self._current = stream or previous  # torch.cuda.stream(None) changes nothing
        try:
            yield
        finally:
            self._current = previous

    StreamContext = stream

    def synchronize(self, device: Any = None) -> None:
        self.handler._handle_device_synchronization()
