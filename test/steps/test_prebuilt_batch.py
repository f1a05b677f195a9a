"""get_new_prebuilt_batch: the real decode mixin method, with mock scheduler parts.

Ported from upstream's TestDecodePrebuilt (sglang PR #35748). The releases
differ in how the method is called, and the test follows the real code of the
release under test rather than a fixed version:
- up to 0.5.15.post1 the method takes no argument and reads
  self.running_batch; from 0.5.16 on it takes running_batch (the test passes
  the scheduler's running_batch wherever the signature asks for it);
- ScheduleBatch.process_prebuilt takes (server_args, future_map) up to 0.5.17
  and (future_map) from 0.5.18 on: the expected call is read off its real
  signature, each parameter naming the scheduler attribute handed to it;
- from 0.5.17 on the decode radix-cache switch comes from the process wide
  get_disagg() rather than self.server_args; it is patched in where the
  method calls it.
The full Scheduler class does not import with the CPU closure (it needs
setproctitle and more), so the helper builds a bare instance of the mixin that
holds the method and sets only what it reads.
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest
from sglang.srt.disaggregation import decode
from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin
from sglang.srt.managers.schedule_batch import ScheduleBatch

INIT_NEW = "sglang.srt.disaggregation.decode.ScheduleBatch.init_new"
METHOD = SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch
DISAGG = SimpleNamespace(disaggregation_decode_enable_radix_cache=False)


def _new_req(rid: str, priority: int = 0) -> MagicMock:
    req = MagicMock(rid=rid)
    req.priority = priority
    return req


def _new_scheduler(
    *, enable_overlap: bool, waiting: list[MagicMock], capacity: int = 8
) -> SchedulerDisaggregationDecodeMixin:
    scheduler = object.__new__(SchedulerDisaggregationDecodeMixin)
    scheduler.grammar_manager = MagicMock()
    scheduler.grammar_manager.has_waiting_grammars.return_value = False
    scheduler.waiting_queue = waiting
    scheduler.enable_priority_scheduling = False
    scheduler.policy = MagicMock()
    scheduler.running_batch = MagicMock()
    scheduler.running_batch.batch_size.return_value = 0
    scheduler.req_to_token_pool = MagicMock(size=capacity)
    scheduler.max_running_requests = capacity
    # Releases before 0.5.17 read the radix-cache switch here, later ones from get_disagg().
    scheduler.server_args = SimpleNamespace(**vars(DISAGG))
    scheduler.tree_cache = MagicMock()
    scheduler.token_to_kv_pool_allocator = MagicMock()
    scheduler.model_config = MagicMock()
    scheduler.enable_overlap = enable_overlap
    scheduler.spec_algorithm = MagicMock()
    scheduler.future_map = MagicMock()
    scheduler.schedule_stream = MagicMock(name="schedule_stream")
    scheduler.forward_stream = MagicMock(name="forward_stream")
    return scheduler


def _recording_batch(scheduler: SchedulerDisaggregationDecodeMixin, order: list[str]) -> MagicMock:
    """A mock batch (and stream) that log prepare, wait and process into order."""
    batch = MagicMock(name="new_batch")
    batch.prepare_for_prebuilt.side_effect = lambda: order.append("prepare")
    batch.process_prebuilt.side_effect = lambda *_: order.append("process")
    scheduler.schedule_stream.wait_stream.side_effect = lambda _: order.append("wait")
    return batch


def _process_prebuilt_args(scheduler: SchedulerDisaggregationDecodeMixin) -> list[object]:
    """What the method must hand process_prebuilt: per the real signature, by name."""
    names = list(inspect.signature(ScheduleBatch.process_prebuilt).parameters)[1:]
    return [getattr(scheduler, name) for name in names]


def _build(
    scheduler: SchedulerDisaggregationDecodeMixin, batch: MagicMock | None
) -> tuple[object, MagicMock]:
    """Call the real method with ScheduleBatch.init_new returning batch."""
    arguments = {
        name: getattr(scheduler, name) for name in list(inspect.signature(METHOD).parameters)[1:]
    }
    with ExitStack() as stack:
        init_new = stack.enter_context(patch(INIT_NEW, return_value=batch))
        if "get_disagg" in METHOD.__code__.co_names:
            stack.enter_context(patch.object(decode, "get_disagg", return_value=DISAGG))
        returned = METHOD(scheduler, **arguments)
    return returned, init_new


@pytest.mark.pass_on("fix-b")
def test_overlap_waits_for_forward_stream_between_prepare_and_process() -> None:
    req = _new_req("r0")
    scheduler = _new_scheduler(enable_overlap=True, waiting=[req])
    order: list[str] = []
    batch = _recording_batch(scheduler, order)

    returned, init_new = _build(scheduler, batch)

    assert returned is batch
    assert init_new.call_args.args[0] == [req]
    assert scheduler.waiting_queue == []
    scheduler.schedule_stream.wait_stream.assert_called_once_with(scheduler.forward_stream)
    assert order == ["prepare", "wait", "process"]
    batch.process_prebuilt.assert_called_once_with(*_process_prebuilt_args(scheduler))


def test_without_overlap_nothing_waits() -> None:
    reqs = [_new_req("r0"), _new_req("r1")]
    scheduler = _new_scheduler(enable_overlap=False, waiting=reqs)
    order: list[str] = []
    batch = _recording_batch(scheduler, order)

    returned, init_new = _build(scheduler, batch)

    assert returned is batch
    assert init_new.call_args.args[0] == reqs
    assert init_new.call_args.args[5] is False  # the batch is built without overlap
    assert scheduler.waiting_queue == []
    scheduler.schedule_stream.wait_stream.assert_not_called()
    assert order == ["prepare", "process"]
    batch.process_prebuilt.assert_called_once_with(*_process_prebuilt_args(scheduler))


def test_empty_waiting_queue_builds_nothing_and_waits_for_nothing() -> None:
    scheduler = _new_scheduler(enable_overlap=True, waiting=[])
    order: list[str] = []
    batch = _recording_batch(scheduler, order)

    returned, init_new = _build(scheduler, batch)

    assert returned is None
    assert scheduler.waiting_queue == []
    init_new.assert_not_called()
    scheduler.schedule_stream.wait_stream.assert_not_called()
    assert order == []


def test_waiting_queue_is_sorted_by_priority_before_selection() -> None:
    low, high = _new_req("low", priority=1), _new_req("high", priority=10)
    queue = [low, high]
    scheduler = _new_scheduler(enable_overlap=False, waiting=queue, capacity=1)
    scheduler.enable_priority_scheduling = True
    scheduler.policy.calc_priority.side_effect = lambda waiting, _: waiting.sort(
        key=lambda req: -req.priority
    )
    batch = MagicMock(name="new_batch")

    returned, init_new = _build(scheduler, batch)

    assert returned is batch
    scheduler.policy.calc_priority.assert_called_once_with(queue, scheduler.running_batch)
    assert [req.rid for req in init_new.call_args.args[0]] == ["high"]
    assert [req.rid for req in scheduler.waiting_queue] == ["low"]
    high.init_next_round_input.assert_called_once_with(scheduler.tree_cache)
    low.init_next_round_input.assert_not_called()
