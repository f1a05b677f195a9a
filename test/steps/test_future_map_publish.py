"""FutureMap.publish on the real class, with CPU tensors and a logging device module.

The FutureMap is constructed for real (on CPU its constructor needs no device
module). torch.get_device_module is patched to return a fake whose events and
streams log what was recorded and what was waited on, as upstream's
test_future_map_npu_d2h.py does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest
import torch
from sglang.srt.managers import overlap_utils
from sglang.srt.managers.overlap_utils import FutureMap
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

POOL_SIZE = 6
UNSET = -1


@dataclass
class FakeEvent:
    log: list[tuple[str, int]]
    number: int

    def record(self) -> None:
        self.log.append(("record", self.number))


@dataclass
class FakeStream:
    log: list[tuple[str, int]]

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait", event.number))


@dataclass
class FakeDeviceModule:
    """Stands in for torch.cuda: every event and stream logs into one list."""

    log: list[tuple[str, int]] = field(default_factory=list)
    events: list[FakeEvent] = field(default_factory=list)

    def Event(self) -> FakeEvent:
        event = FakeEvent(self.log, len(self.events))
        self.events.append(event)
        return event

    def current_stream(self) -> FakeStream:
        return FakeStream(self.log)


@dataclass
class Relay:
    future_map: FutureMap
    device: FakeDeviceModule
    get_device_module: MagicMock


def new_future_map(spec_algo: SpeculativeAlgorithm) -> FutureMap:
    pool = SimpleNamespace(req_to_token=torch.zeros((POOL_SIZE, 4), dtype=torch.int32))
    future_map = FutureMap(
        device=torch.device("cpu"),
        spec_algo=spec_algo,
        req_to_token_pool=pool,
        needs_cpu_seq_lens=True,
    )
    future_map.new_seq_lens_buf.fill_(UNSET)
    return future_map


@pytest.fixture
def relay() -> Iterator[Relay]:
    device = FakeDeviceModule()
    with patch.object(overlap_utils.torch, "get_device_module", return_value=device) as get:
        yield Relay(new_future_map(SpeculativeAlgorithm.EAGLE), device, get)


def seq_lens(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def rows(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_first_publish_creates_and_records_the_event(relay: Relay) -> None:
    relay.future_map.publish(rows([1, 3]), seq_lens([11, 13]))

    assert len(relay.device.events) == 1
    assert relay.future_map.publish_ready is relay.device.events[0]
    assert relay.device.log == [("record", 0)]
    assert relay.future_map.new_seq_lens_buf.tolist() == [UNSET, 11, UNSET, 13, UNSET, UNSET]


def test_later_publishes_record_the_same_event_again(relay: Relay) -> None:
    relay.future_map.publish(rows([1]), seq_lens([10]))
    relay.future_map.publish(rows([1, 4]), seq_lens([11, 40]))
    relay.future_map.publish(rows([2]), seq_lens([20]))

    assert len(relay.device.events) == 1
    assert [entry for entry in relay.device.log if entry[0] == "record"] == [("record", 0)] * 3
    assert relay.future_map.new_seq_lens_buf.tolist() == [UNSET, 11, 20, UNSET, 40, UNSET]


def test_empty_index_returns_without_touching_anything(relay: Relay) -> None:
    relay.future_map.publish(rows([]), seq_lens([]))

    assert relay.future_map.publish_ready is None
    assert relay.get_device_module.call_count == 0
    assert relay.future_map.new_seq_lens_buf.tolist() == [UNSET] * POOL_SIZE

    relay.future_map.publish(rows([5]), seq_lens([50]))
    relay.future_map.publish(rows([]), seq_lens([]))

    assert relay.device.log == [("record", 0)]
    assert relay.future_map.new_seq_lens_buf.tolist() == [UNSET] * 5 + [50]


@pytest.mark.pass_on("!fix-a")
def test_publish_never_waits_on_publish_ready(relay: Relay) -> None:
    relay.future_map.publish(rows([0]), seq_lens([7]))
    relay.future_map.publish(rows([0]), seq_lens([8]))

    assert relay.device.log == [("record", 0), ("record", 0)]
    assert relay.future_map.new_seq_lens_buf[0].item() == 8


@pytest.mark.pass_on("fix-a")
def test_publish_waits_on_the_previous_record_before_recording_again(relay: Relay) -> None:
    relay.future_map.publish(rows([0]), seq_lens([7]))
    relay.future_map.publish(rows([0]), seq_lens([8]))

    assert relay.device.log == [("record", 0), ("wait", 0), ("record", 0)]
    assert relay.future_map.new_seq_lens_buf[0].item() == 8
