"""Simulated CUDA streams and events: ops run at once on the CPU, and each ordering
operation goes to CSAN's EventHandler, whose vector clocks decide what is ordered."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from . import csan

# CSAN knows stream 0 from the start (csan.check_shape pins the value).
DEFAULT_STREAM_ID = 0


def _unmodelled(what: str) -> bool:
    raise NotImplementedError(f"{what}: completion is not modelled; the checker only knows order")


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
        return _unmodelled("SimEvent.query()")


class SimStream:
    def __init__(self, device: SimDevice, name: str, stream_id: int) -> None:
        self.device = device
        self.name = name
        self.stream_id = stream_id

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
        return _unmodelled("SimStream.query()")


class SimDevice:
    """Stands in for torch.cuda as returned by torch.get_device_module()."""

    def __init__(self) -> None:
        self.handler = csan.load().EventHandler()
        self._ids = itertools.count(DEFAULT_STREAM_ID + 1)
        self._default = self._current = SimStream(self, "default stream", DEFAULT_STREAM_ID)
        self.streams: dict[int, SimStream] = {DEFAULT_STREAM_ID: self._default}

    def Stream(self, name: str | None = None, **_options: Any) -> SimStream:
        stream_id = next(self._ids)
        stream = SimStream(self, name or f"stream {stream_id}", stream_id)
        self.handler._handle_stream_creation(stream_id)
        self.streams[stream_id] = stream
        return stream

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
        if stream is None:  # torch.cuda.stream(None) changes nothing
            yield
            return
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = previous

    StreamContext = stream

    def synchronize(self, device: Any = None) -> None:
        self.handler._handle_device_synchronization()

    def stream_name(self, stream_id: int) -> str:
        stream = self.streams.get(stream_id)
        return stream.name if stream else f"stream {stream_id}"
