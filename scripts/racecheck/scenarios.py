"""The scenarios of patchset.plays, played through the real sglang code of the tree
first on sys.path; stand-ins replace only scheduler state the relay does not touch."""

import dataclasses
import inspect
from array import array
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from patchset.plays import BY_NAME, EAGLE, Play

from . import treecode
from .csan import SimDevice
from .report import EAGLE_ROW, Race
from .treecode import EAGLE_TOPK, ScenarioError, sglang_root
from .watch import BufferWatch, simulated_gpu

POOL_SIZE = 8
CONTEXT_LEN = 64
PROMPT_LEN = 5
HIDDEN_SIZE = 4
VOCAB_SIZE = 1000


class _World:  # a decode scheduler's relay state: streams, request pool, FutureMap, ChunkCache
    def __init__(self, device: SimDevice, watch: BufferWatch, server_args: Any):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.device = device
        self.server_args = server_args
        self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
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
        # what ScheduleBatch.init_new takes and the scheduler holds alike
        self.relay = {
            "req_to_token_pool": self.req_to_token_pool,
            "token_to_kv_pool_allocator": None,
            "tree_cache": self.tree_cache,
            "model_config": SimpleNamespace(vocab_size=VOCAB_SIZE),
            "enable_overlap": True,
            "spec_algorithm": self.spec_algorithm,
        }
        # One scheduler for the world's admissions, as a server keeps one.
        self.scheduler = SimpleNamespace(
            **self.relay,
            grammar_manager=mock.Mock(has_waiting_grammars=mock.Mock(return_value=False)),
            enable_priority_scheduling=False,
            running_batch=mock.Mock(batch_size=mock.Mock(return_value=0)),
            max_running_requests=POOL_SIZE,
            server_args=self.server_args,
            future_map=self.future_map,
            schedule_stream=self.schedule_stream,
            forward_stream=self.forward_stream,
            device="cpu",  # where this world's tensors are; get_device_module is simulated
        )

    def inflight_forward(
        self, rows: tuple[int, ...], *, stash: bool = True, runner: Any = None
    ) -> None:
        """run_batch's forward of just-finished requests; a runner gets the read-done event
        where the cuda-graph runners record it: before publish, after it in EAGLE's draft_extend."""
        n = len(rows)
        index = torch.tensor(rows, dtype=torch.int64)
        eagle = not self.spec_algorithm.is_none()
        read_done = self.device.Event()
        self.forward_stream.wait_stream(self.schedule_stream)
        with self.device.stream(self.forward_stream):
            if self.future_map.output_tokens_buf is not None:
                self.future_map.output_tokens_buf[index].sum()  # the forward's input
            if runner is not None and not eagle:
                read_done.record()
            self.future_map.publish(index, torch.full((n,), PROMPT_LEN + 7, dtype=torch.int64))
            if runner is not None and eagle:
                read_done.record()
            if stash:
                self.future_map.stash(index, _stash_payload(n, eagle=eagle))
        if runner is not None:
            setattr(runner, treecode.war_barrier_of_tree().event_attr, read_done)

    def request(self, row: int, *, hisparse: bool = False) -> Any:
        """Prebuilt (KV and draft state arrived), or hisparse (prefilled here in one chunk)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=16)
        extra = {"vocab_size": VOCAB_SIZE} if hisparse else {}
        if hisparse:
            params.normalize(None)  # as the tokenizer manager does
        req = Req(
            rid=f"{'hisparse' if hisparse else 'prebuilt'}-{row}",
            origin_input_text="",
            origin_input_ids=array("q", range(100, 100 + PROMPT_LEN)),
            sampling_params=params,
            **extra,
        )
        if hisparse:
            req.init_next_round_input(self.tree_cache)
            if hasattr(req, "set_extend_range"):  # 0.5.15 on
                req.set_extend_range(0, PROMPT_LEN)
            else:
                req.fill_len = PROMPT_LEN
        else:
            req.output_ids.append(42)
            req.kv_committed_len = PROMPT_LEN
            if self.spec_algorithm.is_eagle():
                req.output_topk_p = [0.9] * EAGLE_TOPK
                req.output_topk_index = [7] * EAGLE_TOPK
                req.hidden_states_tensor = torch.full((HIDDEN_SIZE,), 1.0)
        req.req_pool_idx = row
        return req

    def admit_prebuilt(self, rows: tuple[int, ...]) -> Any:
        """get_new_prebuilt_batch; what a fix keeps on the scheduler lasts to the next one."""
        from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin

        scheduler = self.scheduler
        scheduler.waiting_queue = [self.request(row) for row in rows]
        function = SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch
        # From 0.5.16 on the loop hands in what it read from self (running_batch).
        extra = list(inspect.signature(function).parameters)[1:]
        if missing := [name for name in extra if not hasattr(scheduler, name)]:
            held = "which the scenario's scheduler does not hold"
            raise ScenarioError(f"get_new_prebuilt_batch takes {', '.join(missing)}, {held}")
        batch = function(scheduler, *(getattr(scheduler, name) for name in extra))
        if batch is None or batch.req_pool_indices.tolist() != list(rows):
            raise ScenarioError(
                f"get_new_prebuilt_batch did not admit the requests in rows {list(rows)}"
            )
        return batch

    def prefill_forward(self, reqs: list[Any]) -> tuple[Any, Any]:
        """The prefill forward; copy_done on the copy stream (0.5.15 on) or forward stream."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.utils import GenerationBatchResult

        batch = ScheduleBatch.init_new(reqs=reqs, **self.relay)
        self.inflight_forward(tuple(req.req_pool_idx for req in reqs))
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=torch.full((len(reqs),), 11, dtype=torch.int64),
            extend_input_len_per_req=[PROMPT_LEN] * len(reqs),
            extend_logprob_start_len_per_req=[PROMPT_LEN] * len(reqs),
        )
        result.copy_done = self.device.Event()
        stream = self.forward_stream
        source = (sglang_root() / "srt" / "managers" / "scheduler.py").read_text(encoding="utf-8")
        if "self.copy_stream.wait_stream(self.forward_stream)" in source:
            stream = self.device.Stream(name="copy_stream")
            stream.wait_stream(self.forward_stream)
        with self.device.stream(stream):
            result.copy_to_cpu(return_logprob=False, return_hidden_states=False)
        return batch, result

    def result_processor(self, coordinator: Any) -> Any:
        """The tree's SchedulerBatchResultProcessor: the relay's objects, else mocks."""
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components import batch_result_processor

        cls = batch_result_processor.SchedulerBatchResultProcessor
        known = {
            "is_generation": True,
            "disaggregation_mode": DisaggregationMode.NULL,
            "enable_overlap": True,
            "enable_overlap_mlx": False,
            "server_args": self.server_args,
            # a model without reasoning tokens (0.5.17 on: a list of them)
            "model_config": SimpleNamespace(
                vocab_size=VOCAB_SIZE, think_end_id=None, think_end_ids=None
            ),
            "tree_cache": self.tree_cache,
            "hisparse_coordinator": coordinator,
            "req_to_token_pool": self.req_to_token_pool,
        }
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{f: known[f] if f in known else mock.Mock(name=f) for f in fields})


def _stash_payload(n: int, *, eagle: bool) -> Any:
    """A RelayPayload (0.5.15 on), else the token tensor or the EagleDraftInput itself."""
    from sglang.srt.managers import overlap_utils

    bonus = torch.full((n,), 11, dtype=torch.int64)
    extras = {
        "topk_p": torch.full((n, EAGLE_TOPK), 0.5),
        "topk_index": torch.full((n, EAGLE_TOPK), 3, dtype=torch.int64),
        "hidden_states": torch.full((n, HIDDEN_SIZE), 0.25),
    }
    if (relay_payload := getattr(overlap_utils, "RelayPayload", None)) is not None:
        return relay_payload(bonus_tokens=bonus, **(extras if eagle else {}))
    if not eagle:
        return bonus
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return EagleDraftInput(bonus_tokens=bonus, **extras)


def play(world: _World, scenario: Play) -> None:
    """In the overlap loop's order: iteration N-1's forward in flight; iteration N's WAR
    barrier (loop scenarios), prebuilt seeding and the launch of its own forward."""
    event_attr = treecode.war_barrier_of_tree().event_attr if scenario.barrier else ""
    runner = SimpleNamespace(**{event_attr: None} if event_attr else {})
    with world.device.stream(world.schedule_stream):
        # An earlier iteration's admission, with nothing in flight: a wait made only on the
        # scheduler's first admission (or only on some) leaves the measured one red.
        world.admit_prebuilt(scenario.prebuilt)
        # only the fast configuration's forward records the read-done event
        fast = runner if event_attr and scenario.barrier == "fast" else None
        world.inflight_forward(scenario.forward_rows, stash=not scenario.consumer, runner=fast)
        if scenario.barrier is not None:
            war_barrier(world, runner, enabled=scenario.barrier != "none")
        world.admit_prebuilt(scenario.prebuilt)
        if scenario.barrier is not None:
            # run_batch orders iteration N's forward after the schedule stream.
            world.forward_stream.wait_stream(world.schedule_stream)
    if scenario.consumer:  # a later iteration reads the rows back
        rows = scenario.finished + scenario.prebuilt
        merged = SimpleNamespace(
            spec_info=SimpleNamespace(future_indices=torch.tensor(rows, dtype=torch.int64)),
            req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
            seq_lens=None,
            seq_lens_cpu=None,
            seq_lens_sum=None,
        )
        with world.device.stream(world.device.Stream(name="consumer_stream")):
            world.future_map.resolve_seq_lens_cpu(merged)


def play_hisparse(world: _World, scenario: Play) -> None:
    """H1 in event_loop_overlap's order: prefill, its result processed (synchronizing on
    copy_done), the stash; the coordinator is a mock (its staging copies KV, no relay row)."""
    coordinator = mock.Mock(name="hisparse_coordinator")
    coordinator.collect_ready_reqs.side_effect = lambda: [
        call.args[0] for call in coordinator.admit_request_into_staging.call_args_list
    ]
    build, _how = treecode.scheduler_method("_build_hisparse_decode_batch")
    if build is None:
        raise ScenarioError("the tree's Scheduler has no _build_hisparse_decode_batch")
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(scenario.finished)
        reqs = [world.request(row, hisparse=True) for row in scenario.prebuilt]
        world.forward_stream.wait_stream(world.schedule_stream)  # run_batch's launch
        batch, result = world.prefill_forward(reqs)
        world.result_processor(coordinator).process_batch_result_prefill(batch, result)
        ready = coordinator.collect_ready_reqs()
        if ready != reqs:
            raise ScenarioError(
                "process_batch_result_prefill did not admit the prefilled requests "
                f"into hisparse staging (admitted {len(ready)} of {len(reqs)})"
            )
        scheduler = SimpleNamespace(**world.relay, device="cpu", future_map=world.future_map)
        rows = build(scheduler, ready).req_pool_indices.tolist()
    if rows != list(scenario.prebuilt):
        raise ScenarioError(
            f"_build_hisparse_decode_batch did not build a batch of rows {list(scenario.prebuilt)}"
        )


def war_barrier(world: _World, runner: SimpleNamespace, *, enabled: bool) -> None:
    """The tree's WAR barrier; enabled stands for is_cuda() or SGLANG_ENABLE_WAR_BARRIER."""
    barrier = treecode.war_barrier_of_tree()
    scheduler = barrier.scheduler
    scheduler._war_barrier_enabled = enabled
    worker = {barrier.runner_attr: runner} if barrier.runner_attr else {}
    scheduler.model_worker = SimpleNamespace(**worker)
    scheduler.schedule_stream = world.schedule_stream
    scheduler.forward_stream = world.forward_stream
    barrier.function(scheduler)
    if barrier.event_attr and getattr(runner, barrier.event_attr, None) is not None and enabled:
        raise ScenarioError("the WAR barrier did not consume the read-done event")


def required(scenario: Play) -> set[tuple[str, str, str]]:
    """Accesses a scenario must see, else clean only means the tree took another path."""
    buffers = EAGLE_ROW if scenario.spec == EAGLE else ("output_tokens_buf",)
    if scenario.consumer:  # both streams write the seq lens the consumer reads
        buffers = ("new_seq_lens_buf",)
    seen = {(s, "write", b) for s in ("forward_stream", "schedule_stream") for b in buffers}
    return seen | ({("consumer_stream", "read", buffers[0])} if scenario.consumer else set())


def run(name: str) -> list[Race]:
    """The races CSAN saw as the scenario played on fresh simulated streams."""
    scenario = BY_NAME[name]
    args = treecode.stand_in_server_args(scenario.spec, scenario.hisparse)
    # SamplingBatchInfo and spec_need_hidden_states read the process-wide args.
    with (
        treecode.server_args_published(args),
        simulated_gpu(code_roots=[sglang_root()]) as (device, watch),
    ):
        (play_hisparse if scenario.hisparse else play)(_World(device, watch, args), scenario)
    if missing := sorted(required(scenario) - watch.seen):
        unseen = ", ".join(f"a {kind} of {buf} on {stream}" for stream, kind, buf in missing)
        path = "the tree's relay path differs from the one the scenario drives"
        raise ScenarioError(f"{name} never saw {unseen}; {path}")
    return watch.races
