"""The PD-decode prebuilt scenarios (racecheck.catalogue), driven through the real sglang code.

Imported only in a process whose sys.path has the sglang tree under test
first: FutureMap, ScheduleBatch (init_new, prepare_for_prebuilt,
process_prebuilt), build_eagle_disagg_draft_input, ChunkCache, ReqToTokenPool,
Req, SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch and
Scheduler._apply_war_barrier are all the tree's own. Stand-ins are used only
where the scheduler reads state that has nothing to do with the relay: server
arguments, the grammar manager, the running batch, the model config.

What the scenarios play out: a request that has just finished still has one
forward in flight on the forward stream, which publishes and stashes into its
FutureMap row, while the scheduler, on the schedule stream, hands that row (or
another one) to a prebuilt request whose prefill ran on another server.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import inspect
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from .catalogue import BY_NAME, EAGLE, SCENARIOS, Play
from .races import EAGLE_ROW, Race
from .sim import SimDevice
from .watch import BufferWatch, simulated_gpu

POOL_SIZE = 8
CONTEXT_LEN = 64
PROMPT_LEN = 5
EAGLE_TOPK = 1
HIDDEN_SIZE = 4
VOCAB_SIZE = 1000


@dataclass
class ScenarioRun:
    name: str
    races: list[Race]
    seen: set[tuple[str, str, str]]  # (stream, "read"/"write", buffer)


class _World:
    """A decode scheduler's relay state: streams, request pool, FutureMap, ChunkCache."""

    def __init__(
        self, device: SimDevice, watch: BufferWatch, spec: str | None, hisparse: bool = False
    ) -> None:
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.device = device
        self.server_args = _server_args(spec, hisparse)
        # SamplingBatchInfo and spec_need_hidden_states read the process-wide args.
        _publish_server_args(self.server_args)
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

    def inflight_forward(
        self,
        rows: tuple[int, ...],
        *,
        stash: bool = True,
        read_done: Any = None,
        event_attr: str = "",
    ) -> None:
        """What run_batch does for a batch holding just-finished requests (their
        redundant forward): order after the schedule stream, read the inputs,
        then publish (spec: on_publish, mid worker) and stash the relay payload,
        all on the forward stream. read_done, if given, stands for the forward's
        WAR read-done holder (the event goes into its attribute event_attr,
        named as the tree's barrier reads it); the event is recorded where the cuda-graph
        runners record it: before the decode graph's replay (non-speculative:
        before publish and stash), or in EAGLE's draft_extend, which runs after
        on_publish and before the stash."""
        n = len(rows)
        index = torch.tensor(rows, dtype=torch.int64)

        def record_read_done() -> None:
            event = self.device.Event()
            event.record()
            setattr(read_done, event_attr, event)

        self.forward_stream.wait_stream(self.schedule_stream)
        with self.device.stream(self.forward_stream):
            if self.future_map.output_tokens_buf is not None:
                self.future_map.output_tokens_buf[index].sum()  # the forward's input
            if read_done is not None and self.spec_algorithm.is_none():
                record_read_done()
            self.future_map.publish(index, torch.full((n,), PROMPT_LEN + 7, dtype=torch.int64))
            if read_done is not None and not self.spec_algorithm.is_none():
                record_read_done()
            if stash:
                self.future_map.stash(
                    index, _stash_payload(n, eagle=not self.spec_algorithm.is_none())
                )

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
            model_config=SimpleNamespace(vocab_size=VOCAB_SIZE),
            enable_overlap=True,
            spec_algorithm=self.spec_algorithm,
            future_map=self.future_map,
            schedule_stream=self.schedule_stream,
            forward_stream=self.forward_stream,
        )

    def admit_prebuilt(self, rows: tuple[int, ...]) -> Any:
        """The scheduler thread takes prebuilt requests into pool rows `rows`, one batch."""
        from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin

        scheduler = self.scheduler([self.prebuilt_request(row) for row in rows])
        function = SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch
        # From 0.5.16 on the loop hands in what it used to read from self
        # (running_batch); each such argument is the scheduler's attribute.
        extra = list(inspect.signature(function).parameters)[1:]
        missing = [name for name in extra if not hasattr(scheduler, name)]
        if missing:
            raise ScenarioError(
                f"get_new_prebuilt_batch takes {', '.join(missing)}, which the "
                "scenario's scheduler does not hold"
            )
        batch = function(scheduler, *(getattr(scheduler, name) for name in extra))
        if batch is None or batch.req_pool_indices.tolist() != list(rows):
            raise ScenarioError(
                f"get_new_prebuilt_batch did not admit the requests in rows {list(rows)}"
            )
        return batch

    # The hisparse seam (H1): a request prefilled on this server, staged, then decoded.

    def hisparse_request(self, row: int) -> Any:
        """A new request whose prompt this server prefills, in pool row `row`
        (its sampling parameters normalized as the tokenizer manager does)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=16)
        params.normalize(None)
        req = Req(
            rid=f"hisparse-{row}",
            origin_input_text="",
            origin_input_ids=array("q", range(100, 100 + PROMPT_LEN)),
            sampling_params=params,
            vocab_size=VOCAB_SIZE,
        )
        # What the prefill adder sets when it takes the whole prompt in one chunk.
        req.init_next_round_input(self.tree_cache)
        if hasattr(req, "set_extend_range"):  # 0.5.15 on
            req.set_extend_range(0, PROMPT_LEN)
        else:
            req.fill_len = PROMPT_LEN
        req.req_pool_idx = row
        return req

    def new_batch(self, reqs: list[Any]) -> Any:
        """ScheduleBatch.init_new as the scheduler calls it (the hisparse build's arguments)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        return ScheduleBatch.init_new(
            reqs=reqs,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=None,
            tree_cache=self.tree_cache,
            model_config=SimpleNamespace(vocab_size=VOCAB_SIZE),
            enable_overlap=True,
            spec_algorithm=self.spec_algorithm,
        )

    def prefill_forward(self, reqs: list[Any]) -> tuple[Any, Any]:
        """What run_batch does for the requests' prefill batch: its forward
        relays the sampled token into their rows (as inflight_forward does),
        then copy_to_cpu, the real GenerationBatchResult's, records copy_done
        where this release records it: on the copy stream after it waited for
        the forward stream (0.5.15 on), else on the forward stream itself."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        rows = tuple(req.req_pool_idx for req in reqs)
        batch = self.new_batch(reqs)
        self.inflight_forward(rows)
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=torch.full((len(reqs),), 11, dtype=torch.int64),
            extend_input_len_per_req=[PROMPT_LEN] * len(reqs),
            extend_logprob_start_len_per_req=[PROMPT_LEN] * len(reqs),
        )
        result.copy_done = self.device.Event()
        stream = self.forward_stream
        if _copies_on_copy_stream():
            stream = self.device.Stream(name="copy_stream")
            stream.wait_stream(self.forward_stream)
        with self.device.stream(stream):
            result.copy_to_cpu(return_logprob=False, return_hidden_states=False)
        return batch, result

    def result_processor(self, coordinator: Any) -> Any:
        """The tree's SchedulerBatchResultProcessor (a frozen dataclass of the
        scheduler's collaborators): the relay's own objects where it has them,
        mocks for the rest (metrics, output streaming, the model workers...)."""
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
        return cls(
            **{
                f.name: known[f.name] if f.name in known else mock.Mock(name=f.name)
                for f in dataclasses.fields(cls)
            }
        )

    def hisparse_scheduler(self) -> SimpleNamespace:
        """The attributes _build_hisparse_decode_batch reads from the Scheduler."""
        return SimpleNamespace(
            device="cpu",
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=None,
            tree_cache=self.tree_cache,
            model_config=SimpleNamespace(vocab_size=VOCAB_SIZE),
            enable_overlap=True,
            spec_algorithm=self.spec_algorithm,
            future_map=self.future_map,
        )


class ScenarioError(RuntimeError):
    """The sglang tree did not behave as a scenario needs (not a race)."""


_SERVER_ARGS = {
    "speculative_algorithm": None,
    "enable_hisparse": False,
    "speculative_eagle_topk": EAGLE_TOPK,
    "speculative_num_steps": 1,
    "enable_multi_layer_eagle": False,
    "disaggregation_decode_enable_radix_cache": False,
    "enable_deterministic_inference": False,
    "enable_custom_logit_processor": False,
}


def _server_args(spec: str | None, hisparse: bool = False) -> Any:
    """Stand-in server arguments: the few the relay path reads.

    From 0.5.18 on, publishing the args projects the fields that ServerArgs
    marks with a config namespace into bags (get_spec(), get_disagg(), ...)
    and refuses an object without them; there the stand-in is a ServerArgs
    whose fields hold their declared defaults (its __post_init__, which
    resolves a model, does not run)."""
    values = {**_SERVER_ARGS, "speculative_algorithm": spec, "enable_hisparse": hisparse}
    try:
        from sglang.srt.arg_groups.arg_utils import namespace_of  # noqa: F401
    except ImportError:  # releases before the config bags
        return SimpleNamespace(**values)
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for name, value in values.items():
        object.__setattr__(args, name, value)
    return args


def _publish_server_args(args: Any) -> None:
    """Make args the process-wide server args, where this release keeps them:
    the runtime context (0.5.15 on) or server_args' module global (before)."""
    context = _runtime_context()
    if context is not None and hasattr(context, "set_server_args"):
        context.set_server_args(args)
        return
    from sglang.srt import server_args

    server_args.set_global_server_args_for_scheduler(args)


def _runtime_context() -> Any:
    try:
        from sglang.srt.runtime_context import get_context
    except ImportError:  # 0.5.13 has no runtime context
        return None
    return get_context()


@contextlib.contextmanager
def _server_args_restored() -> Any:
    """Whatever server args the process had published before a scenario (a test
    session, say) come back after it."""
    context = _runtime_context()
    if context is not None and hasattr(context, "set_server_args"):
        from sglang.srt.runtime_context import reset_context

        names = getattr(type(context), "__slots__", None) or list(vars(context))
        saved = {name: getattr(context, name) for name in names if hasattr(context, name)}
        reset_context()
        try:
            yield
        finally:
            for name, value in saved.items():
                object.__setattr__(context, name, value)
        return
    from sglang.srt import server_args

    saved_global = server_args._global_server_args
    try:
        yield
    finally:
        server_args._global_server_args = saved_global


def _stash_payload(n: int, *, eagle: bool) -> Any:
    """What the forward stashes for n requests, in this release's form: a
    RelayPayload (0.5.15 on), else the token tensor (non-speculative) or the
    EagleDraftInput itself (EAGLE)."""
    bonus = torch.full((n,), 11, dtype=torch.int64)
    extras = {
        "topk_p": torch.full((n, EAGLE_TOPK), 0.5),
        "topk_index": torch.full((n, EAGLE_TOPK), 3, dtype=torch.int64),
        "hidden_states": torch.full((n, HIDDEN_SIZE), 0.25),
    }
    from sglang.srt.managers import overlap_utils

    relay_payload = getattr(overlap_utils, "RelayPayload", None)
    if relay_payload is not None:
        return relay_payload(bonus_tokens=bonus, **(extras if eagle else {}))
    if not eagle:
        return bonus
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return EagleDraftInput(bonus_tokens=bonus, **extras)


def play(world: _World, scenario: Play) -> None:
    """One scenario, in the order of the overlap decode loop.

    Iteration N-1 launched a forward for a batch that still held requests
    whose finish only iteration N-1's result processing found; their rows
    went back to the pool. Iteration N then runs, on the schedule stream: the
    WAR barrier (loop scenarios only), batch selection with prebuilt seeding
    (the real get_new_prebuilt_batch), and the launch of its own forward. The
    previous result's processing follows and touches no relay row.
    """
    runner = SimpleNamespace()
    event_attr = war_barrier_of_tree().event_attr if scenario.barrier else ""
    if event_attr:
        setattr(runner, event_attr, None)
    if scenario.barrier != "fast":
        event_attr = ""  # only the fast configuration's forward records the event
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(
            scenario.forward_rows,
            stash=not scenario.consumer,
            read_done=runner if event_attr else None,
            event_attr=event_attr,
        )
        if scenario.barrier is not None:
            war_barrier(world, runner, enabled=scenario.barrier != "none")
        world.admit_prebuilt(scenario.prebuilt)
        if scenario.barrier is not None:
            # The launch of iteration N's forward: run_batch orders it after
            # the schedule stream before the forward reads anything.
            world.forward_stream.wait_stream(world.schedule_stream)
    if scenario.consumer:
        consume(world, scenario.finished + scenario.prebuilt)


def play_hisparse(world: _World, scenario: Play) -> None:
    """H1, the hisparse seam, in the order of the overlap loop (event_loop_overlap).

    Iteration N launched the redundant forward of a batch still holding
    requests that had finished; their rows went back to the pool. The rows go
    to new requests, which hisparse mode prefills here: their prefill forward
    (iteration N+1), then its result processed (the real
    process_batch_result_prefill, which synchronizes on copy_done and admits
    each request into staging), then, once the staging finished, the
    transition: collect_ready_reqs hands them to the real
    Scheduler._build_hisparse_decode_batch, which stashes their last token
    into their rows from the schedule stream. The coordinator is a mock: its
    staging copies KV pages, no relay row.
    """
    coordinator = mock.Mock(name="hisparse_coordinator")
    coordinator.collect_ready_reqs.side_effect = lambda: [
        call.args[0] for call in coordinator.admit_request_into_staging.call_args_list
    ]
    build = scheduler_method("_build_hisparse_decode_batch").function
    if build is None:
        raise ScenarioError("the tree's Scheduler has no _build_hisparse_decode_batch")
    with world.device.stream(world.schedule_stream):
        world.inflight_forward(scenario.finished)
        reqs = [world.hisparse_request(row) for row in scenario.prebuilt]
        world.forward_stream.wait_stream(world.schedule_stream)  # run_batch's launch
        batch, result = world.prefill_forward(reqs)
        world.result_processor(coordinator).process_batch_result_prefill(batch, result)
        ready = coordinator.collect_ready_reqs()
        if ready != reqs:
            raise ScenarioError(
                "process_batch_result_prefill did not admit the prefilled requests "
                f"into hisparse staging (admitted {len(ready)} of {len(reqs)})"
            )
        built = build(world.hisparse_scheduler(), ready)
    if built.req_pool_indices.tolist() != list(scenario.prebuilt):
        raise ScenarioError(
            f"_build_hisparse_decode_batch did not build a batch of rows {list(scenario.prebuilt)}"
        )


@functools.cache
def _copies_on_copy_stream() -> bool:
    """Whether run_batch copies the result to the CPU on copy_stream (0.5.15 on)."""
    source = (sglang_root() / "srt" / "managers" / "scheduler.py").read_text(encoding="utf-8")
    return "self.copy_stream.wait_stream(self.forward_stream)" in source


def consume(world: _World, rows: tuple[int, ...]) -> None:
    """A later iteration reads the rows back; resolve_seq_lens_cpu waits on
    publish_ready before it gathers new_seq_lens_buf."""
    consumer = world.device.Stream(name="consumer_stream")
    merged = SimpleNamespace(
        spec_info=SimpleNamespace(future_indices=torch.tensor(rows, dtype=torch.int64)),
        req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
        seq_lens=None,
        seq_lens_cpu=None,
        seq_lens_sum=None,
    )
    with world.device.stream(consumer):
        world.future_map.resolve_seq_lens_cpu(merged)


# How the tree's WAR barrier was obtained, for the report.
BARRIER_SOURCE: dict[str, str] = {}


@dataclass(frozen=True)
class Barrier:
    """The tree's WAR barrier as the overlap decode loop runs it.

    function(scheduler) is the tree's own code. runner_attr names the
    model_worker attribute that holds the runner whose read-done event the
    barrier consumes and event_attr that event's attribute (0.5.14..0.5.17:
    war_fastpath_runner / war_fastpath_read_done_event; 0.5.18:
    last_shared_read_runner / shared_read_done_event); both are "" where
    the release has no fast path (0.5.13: the loop itself waits on the whole
    forward stream)."""

    function: Callable[..., None]
    scheduler: Any
    runner_attr: str
    event_attr: str


def _names(function: Callable[..., None], suffix: str) -> list[str]:
    return [name for name in function.__code__.co_names if name.endswith(suffix)]


@functools.cache
def war_barrier_of_tree() -> Barrier:
    """Scheduler._apply_war_barrier where the release has it (0.5.14 on), else
    the barrier statement inline in the decode loop (0.5.13)."""
    function, scheduler = _apply_war_barrier()
    if function is None:
        function, scheduler = _inline_barrier()
    runners = _names(function, "_runner")
    events = _names(function, "read_done_event")
    if len(runners) > 1 or len(events) > 1 or len(runners) != len(events):
        raise ScenarioError(
            f"the WAR barrier reads runners {runners} and events {events}; the loop "
            "scenarios model one runner with one read-done event, or none"
        )
    if not events:
        BARRIER_SOURCE["how"] += (
            "; no read-done fast path in this release: the fast configuration "
            "waits on the whole forward stream, as the fallback does"
        )
    return Barrier(function, scheduler, "".join(runners), "".join(events))


def _apply_war_barrier() -> tuple[Callable[..., None] | None, Any]:
    """Scheduler._apply_war_barrier and an object to call it on, or None."""
    method = scheduler_method("_apply_war_barrier")
    if method.function is None:
        return None, None
    BARRIER_SOURCE["how"] = f"Scheduler._apply_war_barrier {method.how}"
    if method.imported:
        from sglang.srt.managers.scheduler import Scheduler

        return method.function, Scheduler.__new__(Scheduler)
    return method.function, SimpleNamespace()


@dataclass(frozen=True)
class Method:
    """A method of the tree's Scheduler: the function, how it was obtained,
    and whether scheduler.py imported (else it was compiled from the source)."""

    function: Callable[..., Any] | None
    how: str = ""
    imported: bool = False


@functools.cache
def scheduler_method(name: str) -> Method:
    """Scheduler.<name> of the tree (its function None where the release has
    no such method).

    scheduler.py imports packages that a CPU environment may lack; then the
    method is compiled from the tree's own source (same file and lines, so
    reports point at it) in a namespace holding what scheduler.py's own
    imports bind for the names the method uses.
    """
    try:
        from sglang.srt.managers.scheduler import Scheduler
    except Exception as err:  # the scheduler module needs more than the relay does
        source = sglang_root() / "srt" / "managers" / "scheduler.py"
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        found = [
            node
            for cls in tree.body
            if isinstance(cls, ast.ClassDef) and cls.name == "Scheduler"
            for node in cls.body
            if isinstance(node, ast.FunctionDef) and node.name == name
        ]
        if not found:
            return Method(None)
        how = (
            f"compiled from scheduler.py's source (the module does not import here: "
            f"{type(err).__name__}: {err})"
        )
        return Method(_compiled(found[0], source, _imports_used(tree, found[0])), how)
    function = getattr(Scheduler, name, None)
    if function is None:
        return Method(None)
    return Method(function, "imported from sglang.srt.managers.scheduler", imported=True)


def _imports_used(module: ast.Module, function: ast.FunctionDef) -> dict[str, Any]:
    """What the module's top-level imports bind, for the names function reads."""
    used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    namespace: dict[str, Any] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if bound in used:
                    top = importlib.import_module(alias.name if alias.asname else bound)
                    namespace[bound] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound = alias.asname or alias.name
                if bound in used:
                    namespace[bound] = getattr(importlib.import_module(node.module), alias.name)
    return namespace


def _inline_barrier() -> tuple[Callable[..., None], Any]:
    """The `if self._war_barrier_enabled:` statement of the decode loop
    (event_loop_overlap_disagg_decode), compiled as a function of self."""
    source = sglang_root() / "srt" / "disaggregation" / "decode.py"
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    loops = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "event_loop_overlap_disagg_decode"
    ]
    found = [
        node
        for loop in loops
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
    statement = found[0]
    wrapper = ast.FunctionDef(
        name="_apply_war_barrier",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg="self")],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[statement],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    ast.copy_location(wrapper, statement)
    ast.fix_missing_locations(wrapper)
    BARRIER_SOURCE["how"] = (
        f"inline in event_loop_overlap_disagg_decode (decode.py:{statement.lineno}), "
        "compiled from the source; the release has no Scheduler._apply_war_barrier"
    )
    from sglang.srt.disaggregation import decode

    return _compiled(wrapper, source, vars(decode)), SimpleNamespace()


def _compiled(function: ast.FunctionDef, source: Path, names: dict[str, Any]) -> Callable[..., Any]:
    namespace = dict(names)
    module = ast.Module(body=[function], type_ignores=[])
    exec(compile(module, str(source), "exec"), namespace)
    return namespace[function.name]


def war_barrier(world: _World, runner: SimpleNamespace, *, enabled: bool) -> None:
    """The tree's WAR barrier on a bare scheduler holding the loop's streams;
    enabled stands for is_cuda() or SGLANG_ENABLE_WAR_BARRIER."""
    barrier = war_barrier_of_tree()
    scheduler = barrier.scheduler
    scheduler._war_barrier_enabled = enabled
    scheduler.model_worker = SimpleNamespace(
        **{barrier.runner_attr: runner} if barrier.runner_attr else {}
    )
    scheduler.schedule_stream = world.schedule_stream
    scheduler.forward_stream = world.forward_stream
    barrier.function(scheduler)
    if barrier.event_attr and getattr(runner, barrier.event_attr, None) is not None and enabled:
        raise ScenarioError("the WAR barrier did not consume the read-done event")


def required(scenario: Play) -> set[tuple[str, str, str]]:
    """Accesses a scenario must see, race or not: without them a clean result
    would only mean that the tree no longer takes the path the scenario drives."""
    if scenario.consumer:
        return {
            ("forward_stream", "write", "new_seq_lens_buf"),
            ("schedule_stream", "write", "new_seq_lens_buf"),
            ("consumer_stream", "read", "new_seq_lens_buf"),
        }
    buffers = EAGLE_ROW if scenario.spec == EAGLE else ("output_tokens_buf",)
    return {(s, "write", b) for s in ("forward_stream", "schedule_stream") for b in buffers}


def sglang_root() -> Path:
    import sglang

    return Path(sglang.__file__).resolve().parent


def run(name: str) -> ScenarioRun:
    """Play one scenario on fresh simulated streams and return the races CSAN saw."""
    scenario = BY_NAME[name]
    driver = Path(__file__).resolve()
    with (
        _server_args_restored(),
        simulated_gpu(code_roots=[sglang_root()], driver_roots=[driver.parent]) as (
            device,
            watch,
        ),
    ):
        world = _World(device, watch, scenario.spec, scenario.hisparse)
        (play_hisparse if scenario.hisparse else play)(world, scenario)
    missing = required(scenario) - watch.seen
    if missing:
        raise ScenarioError(
            f"{name} never saw "
            + ", ".join(f"a {kind} of {buf} on {stream}" for stream, kind, buf in sorted(missing))
            + "; the tree's relay path differs from the one the scenario drives"
        )
    return ScenarioRun(name, watch.races, watch.seen)


def run_all() -> list[ScenarioRun]:
    return [run(name) for name in SCENARIOS]
