"""The three PD-decode prebuilt scenarios, driven through the real sglang code.

Imported only in a process whose sys.path has the sglang tree under test
first: FutureMap, ScheduleBatch (init_new, prepare_for_prebuilt,
process_prebuilt), build_eagle_disagg_draft_input, ChunkCache, ReqToTokenPool,
Req and SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch are all the
tree's own. Stand-ins are used only where the scheduler reads state that has
nothing to do with the relay: server arguments, the grammar manager, the
running batch, the model config.

What the scenarios play out: a request that has just finished still has one
forward in flight on the forward stream, which publishes and stashes into its
FutureMap row, while the scheduler, on the schedule stream, hands that row (or
another one) to a prebuilt request whose prefill ran on another server.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from .races import Race
from .report import SCENARIOS
from .sim import SimDevice
from .watch import BufferWatch, simulated_gpu

POOL_SIZE = 8
CONTEXT_LEN = 64
PROMPT_LEN = 5
EAGLE_TOPK = 1
HIDDEN_SIZE = 4


@dataclass
class ScenarioRun:
    name: str
    races: list[Race]
    seen: set[tuple[str, str, str]]  # (stream, "read"/"write", buffer)


class _World:
    """A decode scheduler's relay state: streams, request pool, FutureMap, ChunkCache."""

    def __init__(self, device: SimDevice, watch: BufferWatch, spec: str | None) -> None:
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.runtime_context import get_context
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.device = device
        self.server_args = _server_args(spec)
        # SamplingBatchInfo and spec_need_hidden_states read the process-wide args.
        get_context().set_server_args(self.server_args)
        self.spec_algorithm = SpeculativeAlgorithm.from_string(spec)
        self.schedule_stream = device.Stream(name="schedule_stream")
        self.forward_stream = device.Stream(name="forward_stream")
        self.req_to_token_pool = ReqToTokenPool(
            size=POOL_SIZE, max_context_len=CONTEXT_LEN, device="cpu", enable_memory_saver=False
        )
        self.tree_cache = ChunkCache(
            CacheInitParams(
                disable=True,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=None,
                page_size=1,
            )
        )
        self.future_map = self.spec_algorithm.create_future_map(
            torch.device("cpu"), self.req_to_token_pool
        )
        watch.watch_attributes(self.future_map)

    def inflight_forward(self, row: int, *, stash: bool = True) -> None:
        """What run_batch does for a just-finished request's redundant forward:
        order after the schedule stream, then publish (spec: on_publish, mid
        worker) and stash the relay payload, all on the forward stream."""
        from sglang.srt.managers.overlap_utils import RelayPayload

        self.forward_stream.wait_stream(self.schedule_stream)
        with self.device.stream(self.forward_stream):
            rows = torch.tensor([row], dtype=torch.int64)
            self.future_map.publish(rows, torch.tensor([PROMPT_LEN + 7], dtype=torch.int64))
            if not stash:
                return
            if self.spec_algorithm.is_none():
                payload = RelayPayload(bonus_tokens=torch.tensor([11], dtype=torch.int64))
            else:
                payload = RelayPayload(
                    bonus_tokens=torch.tensor([11], dtype=torch.int64),
                    topk_p=torch.full((1, EAGLE_TOPK), 0.5),
                    topk_index=torch.full((1, EAGLE_TOPK), 3, dtype=torch.int64),
                    hidden_states=torch.full((1, HIDDEN_SIZE), 0.25),
                )
            self.future_map.stash(rows, payload)

    def prebuilt_request(self, row: int) -> Any:
        """A request whose prefill ran on the prefill server and whose KV (and,
        for EAGLE, draft state) has arrived in pool row `row`."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = Req(
            rid=f"prebuilt-{row}",
            origin_input_text="",
            origin_input_ids=array("q", range(100, 100 + PROMPT_LEN)),
            sampling_params=SamplingParams(max_new_tokens=16),
        )
        req.req_pool_idx = row
        req.output_ids.append(42)
        req.kv_committed_len = PROMPT_LEN
        if self.spec_algorithm.is_eagle():
            req.output_topk_p = [0.9] * EAGLE_TOPK
            req.output_topk_index = [7] * EAGLE_TOPK
            req.hidden_states_tensor = torch.full((HIDDEN_SIZE,), 1.0)
        return req

    def scheduler(self, waiting: list[Any]) -> SimpleNamespace:
        """The attributes get_new_prebuilt_batch reads from the Scheduler."""
        return SimpleNamespace(
            grammar_manager=mock.Mock(has_waiting_grammars=mock.Mock(return_value=False)),
            waiting_queue=waiting,
            enable_priority_scheduling=False,
            running_batch=mock.Mock(batch_size=mock.Mock(return_value=0)),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=None,
            max_running_requests=POOL_SIZE,
            server_args=self.server_args,
            tree_cache=self.tree_cache,
            model_config=SimpleNamespace(vocab_size=1000),
            enable_overlap=True,
            spec_algorithm=self.spec_algorithm,
            future_map=self.future_map,
            schedule_stream=self.schedule_stream,
            forward_stream=self.forward_stream,
        )

    def admit_prebuilt(self, row: int) -> Any:
        """The scheduler thread takes a prebuilt request into pool row `row`."""
        from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin

        scheduler = self.scheduler([self.prebuilt_request(row)])
        batch = SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch(scheduler)
        if batch is None or batch.req_pool_indices.tolist() != [row]:
            raise ScenarioError(f"get_new_prebuilt_batch did not admit the request in row {row}")
        return batch


class ScenarioError(RuntimeError):
    """The sglang tree did not behave as a scenario needs (not a race)."""


def _server_args(spec: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_algorithm=spec,
        speculative_eagle_topk=EAGLE_TOPK,
        speculative_num_steps=1,
        enable_multi_layer_eagle=False,
        disaggregation_decode_enable_radix_cache=False,
        enable_deterministic_inference=False,
        enable_custom_logit_processor=False,
    )


def s1_row_reuse(world: _World) -> None:
    row = 3
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(row)
        world.admit_prebuilt(row)


def s2_consumer(world: _World) -> None:
    forward_row, prebuilt_row = 2, 5
    consumer = world.device.Stream(name="consumer_stream")
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(forward_row, stash=False)
        world.admit_prebuilt(prebuilt_row)
    # A later iteration reads both rows back; resolve_seq_lens_cpu waits on
    # publish_ready before it gathers new_seq_lens_buf.
    rows = [forward_row, prebuilt_row]
    merged = SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=torch.tensor(rows, dtype=torch.int64)),
        req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
        seq_lens=None,
        seq_lens_cpu=None,
        seq_lens_sum=None,
    )
    with world.device.stream(consumer):
        world.future_map.resolve_seq_lens_cpu(merged)


def s3_non_spec(world: _World) -> None:
    row = 4
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(row)
        world.admit_prebuilt(row)


_PLAYS: dict[str, tuple[str | None, Callable[[_World], None]]] = {
    "S1": ("EAGLE", s1_row_reuse),
    "S2": ("EAGLE", s2_consumer),
    "S3": (None, s3_non_spec),
}

_EAGLE_ROW = (
    "new_seq_lens_buf",
    "output_tokens_buf",
    "topk_p_buf",
    "topk_index_buf",
    "hidden_states_buf",
)
# Accesses a scenario must see, race or not: without them a clean result would
# only mean that the tree no longer takes the path the scenario drives.
REQUIRED: dict[str, set[tuple[str, str, str]]] = {
    "S1": {(s, "write", b) for s in ("forward_stream", "schedule_stream") for b in _EAGLE_ROW},
    "S2": {
        ("forward_stream", "write", "new_seq_lens_buf"),
        ("schedule_stream", "write", "new_seq_lens_buf"),
        ("consumer_stream", "read", "new_seq_lens_buf"),
    },
    "S3": {
        ("forward_stream", "write", "output_tokens_buf"),
        ("schedule_stream", "write", "output_tokens_buf"),
    },
}


def sglang_root() -> Path:
    import sglang

    return Path(sglang.__file__).resolve().parent


def run(name: str) -> ScenarioRun:
    """Play one scenario on fresh simulated streams and return the races CSAN saw."""
    from sglang.srt.runtime_context import get_context, reset_context

    spec, play = _PLAYS[name]
    driver = Path(__file__).resolve()
    context = get_context()
    # The scenario publishes its own server args; whatever the process had
    # published before (a test session, say) comes back afterwards.
    saved = {
        slot: getattr(context, slot)
        for slot in getattr(type(context), "__slots__", ())
        if hasattr(context, slot)
    }
    reset_context()
    try:
        with simulated_gpu(code_roots=[sglang_root()], driver_roots=[driver.parent]) as (
            device,
            watch,
        ):
            play(_World(device, watch, spec))
    finally:
        for slot, value in saved.items():
            setattr(context, slot, value)
    missing = REQUIRED[name] - watch.seen
    if missing:
        raise ScenarioError(
            f"{name} never saw "
            + ", ".join(f"a {kind} of {buf} on {stream}" for stream, kind, buf in sorted(missing))
            + "; the tree's relay path differs from the one the scenario drives"
        )
    return ScenarioRun(name, watch.races, watch.seen)


def run_all() -> list[ScenarioRun]:
    return [run(name) for name in SCENARIOS]
