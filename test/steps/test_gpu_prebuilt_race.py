"""S1 on real CUDA streams: a finished request's in-flight forward against prebuilt seeding.

The forward stream is held back with ``torch.cuda._sleep`` and then publishes
and stashes stale values into request-pool row REUSED_ROW through the real
``FutureMap``. Meanwhile the schedule stream hands the same row to a new
prebuilt request through the real ``get_new_prebuilt_batch`` ->
``process_prebuilt`` -> ``build_eagle_disagg_draft_input`` path, which seeds it.
Only the scheduler's surroundings are stand-ins (queue, grammar manager, the
request objects, ``ScheduleBatch.init_new`` and ``prepare_for_prebuilt``).

Without the fix nothing orders the two writers, so the late forward wins. With
0002 the schedule stream waits for the forward stream first, so the seed wins.
The same scenario also runs in a child process under PyTorch's CUDA sanitizer
(CSAN), which must report the race without the fix and stay silent with it.

CUDA_LAUNCH_BLOCKING=1 serialises every launch and CUDA_DEVICE_MAX_CONNECTIONS=1
puts every stream into one hardware queue; either hides the race, so the
fixtures refuse both (ci/run-gpu removes them). One test runs only under
CUDA_DEVICE_MAX_CONNECTIONS=1, as ci/run-gpu's control stage: there the seed
must win without the fix. Without a CUDA device every CUDA test here is
skipped, unless SGLANG_BACKPORTS_REQUIRE_CUDA=1 (ci/run-gpu sets it): then
they fail, so a GPU run cannot pass by skipping. The skips by design, and the
names ci/run-gpu shares with this file, are in ci/gpustage/contract.py.

The sleep is calibrated after warming the GPU (idle clocks would make it far
longer than asked), and the sleep measured in each iteration is recorded with
the S1 tally (record_property, kept in the run's outcome file), as is the CSAN
child's report; ci/run-gpu's summary shows them beside the expected values.

How sglang is imported on a runner without sgl_kernel: ci/gpustage/sglang_import.py
imports the modules with torch.cuda.is_available() answering False for the
import only, so the closure's module-level `if _is_cuda:` branches (they import
sgl_kernel) take their non-CUDA arm; then the real function is back, sglang's
cached is_cuda() is cleared and the `_is_cuda` flags of overlap_utils and
memory_pool are evaluated again. FutureMap.__init__ is the only function on the
path under test that reads such a flag (for its pinned seq_lens copy and D2H
stream), and it reads the restored one. publish, stash, get_new_prebuilt_batch,
process_prebuilt and build_eagle_disagg_draft_input read none: they index the
relay tensors and take streams and events from torch.get_device_module() at
call time. test_path_under_test_reads_no_other_cuda_flag checks this per step.
The rig follows each release's code by feature detection: get_new_prebuilt_batch
gets the scheduler attributes its signature names (running_batch from 0.5.16),
stash gets a RelayPayload where the release has one (else the EagleDraftInput),
and the server args are published as racecheck's scenarios publish them.
The CPU tests at the end (no GPU needed) check the import, the refused
variables, the torn-row judgement and the rig itself on the CPU device.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock, patch

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# pytest puts scripts/ on the path (test/pytest.ini); the CSAN child runs this
# file as a plain script, with the step tree and the site on PYTHONPATH but not
# scripts/ or ci/, so it puts them there itself.
sys.path[:0] = [p for p in (str(ROOT / "ci"), str(ROOT / "scripts")) if p not in sys.path]

from gpustage import contract, evidence, sglang_import  # noqa: E402

# A rehearsal without a GPU plays the CUDA machine before anything imports sglang.
PLAYED = os.environ.get(contract.PLAY_CUDA_ENV) == "1"
if PLAYED:
    sglang_import.play_cuda()


def _rig_fits() -> str:
    """Why the CUDA rig cannot drive this tree, or ''."""
    try:
        sglang_import.import_modules()
    except ImportError as err:
        return f"the rig's modules do not import here ({err})"
    return ""


if _why_not := _rig_fits():
    pytest.skip(f"the CUDA rig cannot run on this release: {_why_not}", allow_module_level=True)
_sglang = sglang_import.import_modules()
decode = _sglang["sglang.srt.disaggregation.decode"]
SchedulerDisaggregationDecodeMixin = decode.SchedulerDisaggregationDecodeMixin
overlap_utils = _sglang["sglang.srt.managers.overlap_utils"]
FutureMap = overlap_utils.FutureMap
ScheduleBatch = _sglang["sglang.srt.managers.schedule_batch"].ScheduleBatch
ReqToTokenPool = _sglang["sglang.srt.mem_cache.memory_pool"].ReqToTokenPool
SpeculativeAlgorithm = _sglang["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
# What stash() takes: a RelayPayload from 0.5.15 on, the EagleDraftInput itself before.
StashPayload = (
    getattr(overlap_utils, "RelayPayload", None)
    or importlib.import_module("sglang.srt.speculative.eagle_info").EagleDraftInput
)
from patchset.paths import DEFAULT_BASE  # noqa: E402

# The racecheck scenarios' stand-in server args: how each release takes them
# (a ServerArgs with config bags from 0.5.18, the runtime context from 0.5.15,
# a module global before) is said once, there.
from racecheck.treecode import server_args_published, stand_in_server_args  # noqa: E402
from testrun.steps import StepUnderTest  # noqa: E402

CSAN_CHILD_FLAG = "--csan-child"

POOL_ROWS = 16
HIDDEN = 64
TOPK = 4
REUSED_ROW = 5  # the finished request's row, handed to the new prebuilt request
RUNNING_ROW = 9  # a request that keeps running; only the forward writes it
SLEEP_MS = 20.0  # how long the forward stream is held back per iteration
WARM_UP_S = 2.0  # busy time before calibrating: idle clocks make the sleep far too long
# Without the fix the late forward must win in at least this share of the
# iterations; a host stall longer than SLEEP_MS can let a seed win now and then.
MIN_RACE_SHARE = 0.9
CSAN_ITERATIONS = 4
TORN = float("nan")  # RowValues.hidden of a row mixed from two writers

FIELDS = ("seq_len", "token", "topk_p", "topk_index", "hidden")


def real_cuda() -> bool:
    """Whether a real CUDA device is here (a played one is not)."""
    return torch.cuda.is_available() and not PLAYED


def _cuda_or_skip() -> torch.device:
    if real_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    reason = contract.PLAYED_CUDA if PLAYED else contract.NO_CUDA
    if os.environ.get(contract.REQUIRE_CUDA_ENV) == "1":
        pytest.fail(f"{contract.REQUIRE_CUDA_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def s1_iterations() -> int:
    """The S1 iterations of this run: contract.S1_ITERATIONS_ENV, at least the minimum."""
    text = os.environ.get(contract.S1_ITERATIONS_ENV, str(contract.S1_MIN_ITERATIONS))
    if not text.isdigit() or int(text) < contract.S1_MIN_ITERATIONS:
        pytest.fail(
            f"{contract.S1_ITERATIONS_ENV}={text!r}: give a whole number of at least "
            f"{contract.S1_MIN_ITERATIONS}",
            pytrace=False,
        )
    return int(text)


@dataclass(frozen=True)
class RowValues:
    """What one request-pool row of the relay holds, field by field."""

    seq_len: int
    token: int
    topk_p: tuple[float, ...]
    topk_index: tuple[int, ...]
    hidden: float  # every element of the row carries this value; TORN when they differ

    def differing(self, other: RowValues) -> list[str]:
        return [name for name in FIELDS if getattr(self, name) != getattr(other, name)]


def seeded_values(i: int) -> RowValues:
    """What the new prebuilt request of iteration i brings from its prefill."""
    return RowValues(
        seq_len=40 + i % 50,
        token=7000 + i,
        topk_p=tuple(0.5**k for k in range(1, TOPK + 1)),  # exact in float32
        topk_index=tuple(100 + i + k for k in range(TOPK)),
        hidden=float(i) + 0.25,
    )


def stale_values(i: int, row: int) -> RowValues:
    """What the in-flight forward of iteration i publishes and stashes for a row."""
    return RowValues(
        seq_len=50_000 + 100 * row + i,
        token=90_000 + 100 * row + i,
        topk_p=tuple(row + 0.125 * (k + 1) for k in range(TOPK)),
        topk_index=tuple(30_000 + row + k for k in range(TOPK)),
        hidden=-float(i) - row,
    )


def _prebuilt_request(i: int) -> SimpleNamespace:
    """A decode request whose prefill ran elsewhere, with the fields the path reads."""
    seed = seeded_values(i)
    return SimpleNamespace(
        rid=f"prebuilt-{i}",
        req_pool_idx=REUSED_ROW,
        # prepare_for_prebuilt counts seq_len as len(origin) + len(output) - 1
        origin_input_ids=list(range(seed.seq_len)),
        output_ids=[seed.token],
        output_topk_p=list(seed.topk_p),
        output_topk_index=list(seed.topk_index),
        hidden_states_tensor=torch.full((HIDDEN,), seed.hidden, dtype=torch.float32),
        output_dsa_topk_indices=None,
        grammar=None,
        last_node=None,
        kv_committed_len=None,
        init_next_round_input=lambda tree_cache: None,
        time_stats=SimpleNamespace(set_forward_entry_time=lambda ts: None),
    )


def _init_new_batch(
    reqs: list[Any],
    req_to_token_pool: ReqToTokenPool,
    token_to_kv_pool_allocator: Any,
    tree_cache: Any,
    model_config: Any,
    enable_overlap: bool,
    spec_algorithm: SpeculativeAlgorithm,
) -> ScheduleBatch:
    """A real ScheduleBatch holding what process_prebuilt reads; no KV pool behind it."""
    batch = ScheduleBatch.__new__(ScheduleBatch)
    batch.reqs = reqs
    batch.req_to_token_pool = req_to_token_pool
    batch.tree_cache = tree_cache
    batch.model_config = model_config
    batch.enable_overlap = enable_overlap
    batch.spec_algorithm = spec_algorithm
    batch.device = req_to_token_pool.device
    batch.spec_info = None
    batch.return_logprob = False
    return batch


def _prepare_rows(batch: ScheduleBatch) -> None:
    """The part of prepare_for_prebuilt that process_prebuilt depends on.

    The real method also fills KV locations and sampling info from a live
    model config; the seeding only reads req_pool_indices and seq_lens, which
    are computed here the same way.
    """
    rows = [req.req_pool_idx for req in batch.reqs]
    seq_lens = [len(r.origin_input_ids) + max(0, len(r.output_ids) - 1) for r in batch.reqs]
    batch.req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=batch.device)
    batch.seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=batch.device)


class Rig:
    """A FutureMap, two streams and a decode scheduler wired like sglang's overlap loop."""

    def __init__(self, device: torch.device, sleep_cycles: int) -> None:
        self.device = device
        self.sleep_cycles = sleep_cycles
        self.module = torch.get_device_module(device)
        self.slept_ms: list[float] = []  # the forward's measured sleep, per iteration
        self.server_args = stand_in_server_args("EAGLE")
        object.__setattr__(self.server_args, "speculative_eagle_topk", TOPK)
        # FutureMap sizes its hidden-state relay from the process-wide args;
        # close() brings back what the process had published before.
        self._restore = ExitStack()
        self._restore.enter_context(server_args_published(self.server_args))
        self.forward_stream = self.module.Stream()
        self.schedule_stream = self.module.Stream()
        self.pool = ReqToTokenPool(
            size=POOL_ROWS, max_context_len=8, device=str(device), enable_memory_saver=False
        )
        spec = SpeculativeAlgorithm.from_string("EAGLE")
        self.future_map = FutureMap(device, spec, self.pool)
        self._prime()
        self.scheduler = SimpleNamespace(
            grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
            waiting_queue=[],
            enable_priority_scheduling=False,
            running_batch=SimpleNamespace(batch_size=lambda: 0),
            req_to_token_pool=self.pool,
            max_running_requests=POOL_ROWS,
            server_args=self.server_args,
            tree_cache=MagicMock(name="tree_cache"),
            token_to_kv_pool_allocator=None,
            model_config=None,
            enable_overlap=True,
            spec_algorithm=spec,
            future_map=self.future_map,
            forward_stream=self.forward_stream,
            schedule_stream=self.schedule_stream,
        )

    def _prime(self) -> None:
        """Let the first stash size the relay buffers, outside the race."""
        rows = torch.arange(POOL_ROWS, dtype=torch.int64, device=self.device)
        self.future_map.publish(rows, torch.zeros(POOL_ROWS, dtype=torch.int64, device=self.device))
        self.future_map.stash(rows, self._payload([stale_values(-1, r) for r in range(POOL_ROWS)]))
        self.module.synchronize()

    def _payload(self, values: list[RowValues]) -> Any:
        dev = self.device
        return StashPayload(
            bonus_tokens=torch.tensor([v.token for v in values], dtype=torch.int64, device=dev),
            topk_p=torch.tensor([v.topk_p for v in values], dtype=torch.float32, device=dev),
            topk_index=torch.tensor([v.topk_index for v in values], dtype=torch.int64, device=dev),
            hidden_states=torch.stack(
                [torch.full((HIDDEN,), v.hidden, dtype=torch.float32) for v in values]
            ).to(dev),
        )

    @contextmanager
    def scheduler_surroundings(self) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(
                patch(
                    "sglang.srt.disaggregation.decode.ScheduleBatch.init_new",
                    side_effect=_init_new_batch,
                )
            )
            stack.enter_context(patch.object(ScheduleBatch, "prepare_for_prebuilt", _prepare_rows))
            yield

    def read_row(self, row: int) -> RowValues:
        fm = self.future_map
        hidden = fm.hidden_states_buf[row]
        # Two unordered stash() writers can leave the row mixed (torn): the seed lost.
        whole = bool((hidden == hidden[0]).all())
        return RowValues(
            seq_len=int(fm.new_seq_lens_buf[row]),
            token=int(fm.output_tokens_buf[row]),
            topk_p=tuple(float(x) for x in fm.topk_p_buf[row].tolist()),
            topk_index=tuple(int(x) for x in fm.topk_index_buf[row].tolist()),
            hidden=float(hidden[0]) if whole else TORN,
        )

    def run_once(self, i: int) -> tuple[RowValues, RowValues]:
        """One round of S1; returns what REUSED_ROW and RUNNING_ROW hold afterwards."""
        forward_rows = [REUSED_ROW, RUNNING_ROW]
        stale_rows = torch.tensor(forward_rows, dtype=torch.int64, device=self.device)
        stale = [stale_values(i, row) for row in forward_rows]
        stale_payload = self._payload(stale)
        stale_seq_lens = torch.tensor([v.seq_len for v in stale], device=self.device)

        # The forward of the last iteration, still running: it only starts
        # writing after the sleep, long after the host has moved on.
        self.forward_stream.wait_stream(self.module.current_stream())
        with self.module.stream(self.forward_stream):
            if self.sleep_cycles:
                slept = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                slept[0].record()
                torch.cuda._sleep(self.sleep_cycles)
                slept[1].record()
            self.future_map.publish(stale_rows, stale_seq_lens)
            self.future_map.stash(stale_rows, stale_payload)

        # The scheduler admits a prebuilt request into the row just freed.
        self.scheduler.waiting_queue = [_prebuilt_request(i)]
        with self.module.stream(self.schedule_stream):
            batch = get_new_prebuilt_batch(self.scheduler)
        if batch is None or [r.rid for r in batch.reqs] != [f"prebuilt-{i}"]:
            raise AssertionError(f"get_new_prebuilt_batch did not admit the request: {batch}")

        self.module.synchronize()
        if self.sleep_cycles:
            self.slept_ms.append(slept[0].elapsed_time(slept[1]))
        return self.read_row(REUSED_ROW), self.read_row(RUNNING_ROW)

    def close(self) -> None:
        self._restore.close()


def get_new_prebuilt_batch(scheduler: Any) -> Any:
    """The real method; from 0.5.16 on the loop hands in what it used to read
    from self (running_batch): each such argument is the scheduler's attribute."""
    method = SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch
    extra = list(inspect.signature(method).parameters)[1:]
    return method(scheduler, *(getattr(scheduler, name) for name in extra))


def warm_up_gpu(seconds: float) -> None:
    """Keep the GPU busy for a while, so that its clocks leave idle before calibrating
    (345 MHz idle against 1980 MHz under load were seen on an H200)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def time_sleep_ms(cycles: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def calibrate_sleep_cycles(ms: float) -> int:
    """GPU clock cycles that keep torch.cuda._sleep busy for about ms milliseconds, warm."""
    warm_up_gpu(WARM_UP_S)
    probe = 10_000_000
    time_sleep_ms(probe)  # the kernel's first launch
    probe_ms = sorted(time_sleep_ms(probe) for _ in range(3))[1]
    return max(1, int(probe * ms / max(probe_ms, 1e-3)))


@dataclass
class RaceTally:
    iterations: int
    seed_won: int = 0
    stale_fields: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    running_row_wrong: int = 0  # iterations in which the forward's own row was not written
    torn: int = 0  # iterations whose hidden-state row came back mixed from both writers
    sleep_target_ms: float = 0.0
    sleep_cycles: int = 0
    slept_ms: dict[str, float] = field(default_factory=dict)  # measured: median, min, max
    clocks_warm: str | None = None  # nvidia-smi's clocks, read after the warm-up

    def count(self, i: int, reused: RowValues, running: RowValues) -> None:
        """Judge one iteration: the seed won only if every field holds the seed's value.

        A field may hold the forward's value instead (it won there), and the
        hidden-state row may be torn (both stash() writers landed on it at
        once): both count as a lost seed. Anything else is a broken rig.
        """
        wrong = reused.differing(seeded_values(i))
        if not wrong:
            self.seed_won += 1
        for name in wrong:
            if name == "hidden" and math.isnan(reused.hidden):
                self.torn += 1
            elif getattr(reused, name) == getattr(stale_values(i, REUSED_ROW), name):
                self.stale_fields[name] += 1
            else:
                raise AssertionError(
                    f"iteration {i}: row {REUSED_ROW} field {name} holds "
                    f"{getattr(reused, name)!r}, neither the seed nor the forward's"
                )
        if running != stale_values(i, RUNNING_ROW):
            self.running_row_wrong += 1

    def summary(self) -> str:
        return (
            f"{self.seed_won}/{self.iterations} iterations kept the seed; the late forward "
            f"won per field: {self.stale_fields}; hidden row torn in {self.torn}; forward "
            f"row unwritten in {self.running_row_wrong}; sleep {self.slept_ms} ms measured "
            f"for {self.sleep_target_ms} ms asked"
        )

    def record(self, record_property: Callable[[str, object], None]) -> None:
        """Keep the tally, with the sleep really measured, in the run's outcome file."""
        record = {**asdict(self), "connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
        record_property(contract.S1_PROPERTY, json.dumps(record, sort_keys=True))


def run_s1(device: torch.device, iterations: int, sleep_ms: float) -> RaceTally:
    sleep_cycles = calibrate_sleep_cycles(sleep_ms) if sleep_ms else 0
    clocks = evidence.clocks() if sleep_cycles else None  # warm now: the clocks the sleep ran at
    rig = Rig(device, sleep_cycles)
    try:
        with rig.scheduler_surroundings():
            rig.run_once(-1)  # first call pays for lazy imports; not counted
            rig.slept_ms.clear()
            tally = RaceTally(
                iterations, sleep_target_ms=sleep_ms, sleep_cycles=sleep_cycles, clocks_warm=clocks
            )
            for i in range(iterations):
                tally.count(i, *rig.run_once(i))
            if rig.slept_ms:
                slept = sorted(rig.slept_ms)
                tally.slept_ms = {
                    "median": slept[len(slept) // 2],
                    "min": slept[0],
                    "max": slept[-1],
                }
            return tally
    finally:
        rig.close()


def refused_environment(environ: Mapping[str, str]) -> list[str]:
    """Why this environment would hide the race; empty when it would not."""
    reasons = []
    if environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
        reasons.append("CUDA_LAUNCH_BLOCKING is set: it serialises every launch")
    connections = environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if connections is not None and not (connections.isdigit() and int(connections) >= 2):
        reasons.append(
            f"CUDA_DEVICE_MAX_CONNECTIONS={connections}: fewer than 2 hardware queues put "
            "both streams into one queue"
        )
    return reasons


def _refuse_hiding_environment() -> None:
    reasons = refused_environment(os.environ)
    if reasons:
        pytest.fail(
            "; ".join(reasons) + ". Either hides the race; unset it (ci/run-gpu does).",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def s1_tally() -> RaceTally:
    device = _cuda_or_skip()
    _refuse_hiding_environment()
    return run_s1(device, s1_iterations(), SLEEP_MS)


@pytest.mark.pass_on("fix-b")
def test_seed_survives_the_in_flight_forward(
    s1_tally: RaceTally, record_property: Callable[[str, object], None]
) -> None:
    s1_tally.record(record_property)
    assert s1_tally.running_row_wrong == 0, s1_tally.summary()
    assert s1_tally.seed_won == s1_tally.iterations, s1_tally.summary()


@pytest.mark.pass_on("!fix-b")
def test_in_flight_forward_overwrites_the_seed_without_the_fix(
    s1_tally: RaceTally, step: StepUnderTest, record_property: Callable[[str, object], None]
) -> None:
    """The known failure: the rig really races, so the 0002 pass means something.

    0001 chains publish_ready but does not order the writers: the seq_len
    write comes before its wait, so the forward's seq_len still wins there.
    """
    s1_tally.record(record_property)
    assert s1_tally.running_row_wrong == 0, s1_tally.summary()
    need = int(MIN_RACE_SHARE * s1_tally.iterations)
    assert s1_tally.stale_fields["seq_len"] >= need, s1_tally.summary()
    if step.holds("!fix-a"):
        for name in FIELDS:
            assert s1_tally.stale_fields[name] >= need, s1_tally.summary()


def test_one_hardware_queue_hides_the_race(record_property: Callable[[str, object], None]) -> None:
    """The control: with CUDA_DEVICE_MAX_CONNECTIONS=1 both streams share one hardware
    queue, so the forward's late writes run before the seed, launched after them,
    even without the fix. The race the other tests show needs two queues."""
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        pytest.skip(contract.ONE_QUEUE_ONLY)
    device = _cuda_or_skip()
    blocking = [r for r in refused_environment(os.environ) if r.startswith("CUDA_LAUNCH")]
    if blocking:  # it would hide the race too: the control would show nothing
        pytest.fail(f"{blocking[0]}; unset it (ci/run-gpu does)", pytrace=False)
    tally = run_s1(device, s1_iterations(), SLEEP_MS)
    tally.record(record_property)
    assert tally.running_row_wrong == 0, tally.summary()
    assert tally.seed_won == tally.iterations, tally.summary()


def test_without_the_hold_back_the_seed_wins(
    record_property: Callable[[str, object], None],
) -> None:
    """The control of the timing, on the step without the fix: with the forward not held
    back (sleep 0) its writes are done before the host has seeded, so the seed wins. The
    race the other tests show needs the forward to be late, as an in-flight one is."""
    if os.environ.get(contract.NO_SLEEP_ENV) != "1":
        pytest.skip(contract.NO_SLEEP_ONLY)
    device = _cuda_or_skip()
    _refuse_hiding_environment()
    tally = run_s1(device, s1_iterations(), sleep_ms=0)
    tally.record(record_property)
    assert tally.running_row_wrong == 0, tally.summary()
    assert tally.seed_won >= int(MIN_RACE_SHARE * tally.iterations), tally.summary()


def csan_child(iterations: int) -> dict[str, Any]:
    """Run S1 under CSAN (TORCH_CUDA_SANITIZER=1 set before torch was imported)."""
    from torch.cuda._sanitizer import CUDASanitizerErrors, cuda_sanitizer

    if not cuda_sanitizer.enabled:
        return {"error": "CSAN is not enabled; set TORCH_CUDA_SANITIZER=1 before importing torch"}
    if not torch.cuda.is_available():
        return {"error": "no CUDA device"}
    rig = Rig(torch.device("cuda", torch.cuda.current_device()), sleep_cycles=0)
    relay_buffers = {
        name: getattr(rig.future_map, name).data_ptr()
        for name in ("new_seq_lens_buf", "output_tokens_buf", "topk_p_buf", "topk_index_buf")
    }
    by_pointer = {ptr: name for name, ptr in relay_buffers.items()}
    try:
        with rig.scheduler_surroundings():
            for i in range(iterations):
                try:
                    reused, _ = rig.run_once(i)
                except CUDASanitizerErrors as errors:
                    return {
                        "race": True,
                        "iteration": i,
                        "buffers": sorted(
                            by_pointer.get(e.data_ptr, f"other tensor {e.data_ptr}")
                            for e in errors.errors
                        ),
                        "streams": sorted(
                            {e.current_access.stream for e in errors.errors}
                            | {e.previous_access.stream for e in errors.errors}
                        ),
                        "schedule_stream": rig.schedule_stream.cuda_stream,
                        "forward_stream": rig.forward_stream.cuda_stream,
                    }
                if reused.differing(seeded_values(i)):
                    return {"error": f"iteration {i}: the seed was lost: {reused}"}
        return {"race": False, "iterations": iterations}
    finally:
        rig.close()


def run_csan_child(env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """This file as a plain script, the way the CSAN verdict runs it."""
    return subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), CSAN_CHILD_FLAG, str(CSAN_ITERATIONS)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=contract.CSAN_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def csan_report() -> dict[str, Any]:
    _cuda_or_skip()
    _refuse_hiding_environment()
    result = run_csan_child({**os.environ, "TORCH_CUDA_SANITIZER": "1"})
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        pytest.fail(
            f"the CSAN child exited {result.returncode}\nstdout:\n{result.stdout[-4000:]}"
            f"\nstderr:\n{result.stderr[-4000:]}",
            pytrace=False,
        )
    report = json.loads(lines[-1])
    report["stderr_tail"] = result.stderr[-2000:]
    return report


def _record_csan(report: dict[str, Any], record_property: Callable[[str, object], None]) -> None:
    kept = {k: v for k, v in report.items() if k != "stderr_tail"}
    record_property(contract.CSAN_PROPERTY, json.dumps(kept, sort_keys=True))


@pytest.mark.pass_on("fix-b")
def test_csan_is_silent_with_the_fix(
    csan_report: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    _record_csan(csan_report, record_property)
    assert "error" not in csan_report, csan_report
    assert csan_report["race"] is False, csan_report
    assert csan_report["iterations"] == CSAN_ITERATIONS, csan_report


@pytest.mark.pass_on("!fix-b")
def test_csan_reports_the_race_without_the_fix(
    csan_report: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    _record_csan(csan_report, record_property)
    assert "error" not in csan_report, csan_report
    assert csan_report["race"] is True, csan_report
    # The first unordered write is publish()'s seq_len row, between the two streams.
    assert "new_seq_lens_buf" in csan_report["buffers"], csan_report
    assert {csan_report["schedule_stream"], csan_report["forward_stream"]} <= set(
        csan_report["streams"]
    ), csan_report


# CPU tests: no GPU needed; they run on every step of the CPU gate too.


def _import_as_on_a_cuda_machine(through_helper: bool) -> dict[str, Any]:
    """In a forked child: forget sglang, play a CUDA machine without sgl_kernel, import
    sglang again; through the helper, then also what the path imports when it runs."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    sglang_import.play_cuda()
    try:
        if through_helper:
            mods = sglang_import.import_modules()
            flags = {
                m: mods[m]._is_cuda
                for m in ("sglang.srt.managers.overlap_utils", "sglang.srt.mem_cache.memory_pool")
            }
        else:
            importlib.import_module("sglang.srt.managers.overlap_utils")
            importlib.import_module("sglang.srt.disaggregation.decode")
            flags = {}
    except ImportError as err:
        return {"import_error": err.name}
    answer: dict[str, Any] = {"flags": flags, "available": torch.cuda.is_available()}
    if through_helper:
        # as the path's first call imports them, after the window, with is_cuda() True
        call_time = sorted(set().union(*sglang_import.call_time_imports().values()))
        errors = {}
        for name in call_time:
            try:
                importlib.import_module(name)
            except ImportError as err:
                errors[name] = str(err)
        answer.update(call_time=call_time, call_time_errors=errors)
    answer["sgl_kernel"] = "sgl_kernel" in sys.modules
    return answer


@functools.cache
def _in_a_fork(through_helper: bool) -> dict[str, Any]:
    """_import_as_on_a_cuda_machine's answer, from a child that leaves this process as it is.

    The child starts from this process, so it pays only for sglang's own
    modules, not for torch's and transformers' import again.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = _import_as_on_a_cuda_machine(through_helper)
        except BaseException as err:  # reported to the parent, which fails the test
            answer = {"crash": repr(err)}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def _once_only(step: StepUnderTest) -> None:
    """Skip on every step but the default base's final one (a fresh import costs seconds)."""
    if not step.is_final or step.series.folder.name != f"sglang-{DEFAULT_BASE}":
        pytest.skip(contract.ONCE_ONLY)


def child_pythonpath(tree: str, environ: Mapping[str, str]) -> str:
    """The CSAN child's PYTHONPATH: the stage's (the step tree, the wheelhouse's site),
    less scripts/ and ci/, which the child must put on its import path itself."""
    ours = {str(ROOT / "scripts"), str(ROOT / "ci"), tree}
    kept = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    return os.pathsep.join([tree, *kept])


def test_csan_child_imports_as_a_plain_script(step: StepUnderTest) -> None:
    """The CSAN child runs this file as a script, with the stage's PYTHONPATH (the step
    tree and the site, as a GPU stage has it) less scripts/ and ci/: it must still import
    our modules and sglang's closure. Without the sanitizer (CSAN needs a driver even to
    import torch) it gets as far as asking for it, and says so as its JSON answer."""
    _once_only(step)
    import sglang

    tree = str(Path(sglang.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_SANITIZER"}
    env.update(PYTHONPATH=child_pythonpath(tree, os.environ), CUDA_VISIBLE_DEVICES="")
    result = run_csan_child(env)
    answers = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and answers, result.stderr[-3000:]
    assert json.loads(answers[-1]) == {
        "error": "CSAN is not enabled; set TORCH_CUDA_SANITIZER=1 before importing torch"
    }, result.stdout


def test_cuda_visible_import_needs_no_sgl_kernel(step: StepUnderTest) -> None:
    """Where CUDA is visible, a plain import needs sgl_kernel; the rig's import does not."""
    if real_cuda():
        pytest.skip(contract.CUDA_PRESENT)
    _once_only(step)
    results = {helper: _in_a_fork(helper) for helper in (False, True)}
    assert results[False] == {"import_error": "sgl_kernel"}, results
    played = {k: v for k, v in results[True].items() if not k.startswith("call_time")}
    assert played == {
        "flags": {
            "sglang.srt.managers.overlap_utils": True,
            "sglang.srt.mem_cache.memory_pool": True,
        },
        "available": True,
        "sgl_kernel": False,
    }, results


def test_call_time_imports_need_no_sgl_kernel(step: StepUnderTest) -> None:
    """What the path under test imports when it runs (read from the bytecode of its
    functions and of the sglang functions they call) is imported inside the rig's
    CUDA-hidden window. Imported at the first stash instead, with is_cuda() True,
    spec_utils would import sgl_kernel and every S1 stage would fail."""
    if real_cuda():
        pytest.skip(contract.CUDA_PRESENT)
    _once_only(step)
    answer = _in_a_fork(True)
    assert "import_error" not in answer, answer
    assert "sglang.srt.speculative.spec_utils" in answer["call_time"], answer
    assert answer["call_time_errors"] == {}, answer["call_time_errors"]
    assert answer["sgl_kernel"] is False, answer


def test_path_under_test_reads_no_other_cuda_flag() -> None:
    read = sglang_import.cuda_flags_read()
    unrestored = {f: flags - set(sglang_import.RESTORED) for f, flags in read.items()}
    assert not any(unrestored.values()), unrestored
    # The analysis does see flags: FutureMap.__init__ reads _is_cuda, restored after import.
    assert read["sglang.srt.managers.overlap_utils.FutureMap.__init__"] == {"_is_cuda"}
    overlap_utils = _sglang["sglang.srt.managers.overlap_utils"]
    from sglang.srt.utils import common

    assert overlap_utils._is_cuda == common.is_cuda() == torch.cuda.is_available()


def test_path_under_test_holds_the_relay_methods_it_calls() -> None:
    """Every FutureMap method that the path's FutureMap methods call is on the path
    (and so checked above): a release that adds one must add it to PATH_UNDER_TEST."""
    listed = {
        qualname.removeprefix("FutureMap.")
        for module, qualname in sglang_import.path_under_test()
        if module == overlap_utils.__name__ and qualname.startswith("FutureMap.")
    }
    called = {
        name
        for method in listed
        for name in getattr(FutureMap, method).__code__.co_names
        if inspect.isfunction(getattr(FutureMap, name, None))
    }
    assert {"publish", "stash", "__init__"} <= listed, listed
    assert called <= listed, called - listed


@pytest.mark.parametrize(
    ("environ", "refused"),
    [
        ({}, []),
        ({"CUDA_LAUNCH_BLOCKING": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}, []),
        ({"CUDA_LAUNCH_BLOCKING": "1"}, ["CUDA_LAUNCH_BLOCKING"]),
        ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, ["CUDA_DEVICE_MAX_CONNECTIONS=1"]),
        (
            {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "x"},
            ["CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS=x"],
        ),
    ],
)
def test_variables_that_hide_the_race_are_refused(
    environ: dict[str, str], refused: list[str]
) -> None:
    reasons = refused_environment(environ)
    assert [r.split(" ")[0].rstrip(":") for r in reasons] == refused, reasons


def test_torn_hidden_row_counts_as_a_lost_seed() -> None:
    tally = RaceTally(2)
    seed = seeded_values(0)
    torn = RowValues(seed.seq_len, seed.token, seed.topk_p, seed.topk_index, TORN)
    tally.count(0, torn, stale_values(0, RUNNING_ROW))
    tally.count(1, seeded_values(1), stale_values(1, RUNNING_ROW))
    assert (tally.seed_won, tally.torn, tally.stale_fields["hidden"]) == (1, 1, 0)
    foreign = RowValues(1, seed.token, seed.topk_p, seed.topk_index, seed.hidden)
    with pytest.raises(AssertionError, match="neither the seed nor the forward's"):
        tally.count(0, foreign, stale_values(0, RUNNING_ROW))


def test_rig_runs_the_real_path_on_the_cpu_device() -> None:
    """On the CPU device every write runs at once, in program order: the seed comes last.

    The tally's record is what ci/run-gpu's summary reads: it must judge it."""
    tally = run_s1(torch.device("cpu"), iterations=3, sleep_ms=0)
    assert (tally.seed_won, tally.running_row_wrong, tally.torn) == (3, 0, 0), tally.summary()
    recorded: dict[str, object] = {}
    tally.record(recorded.__setitem__)
    record = json.loads(str(recorded[contract.S1_PROPERTY]))
    assert (record["iterations"], record["seed_won"], record["slept_ms"]) == (3, 3, {})
    rows = evidence.s1_rows("cpu", record, ["fix-b"])
    assert rows[0] == ("cpu: S1 seed kept", "3/3 (100.0%); torn rows 0", rows[0][2], "yes"), rows
    assert rows[-1][1] == "not measured", rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CSAN_CHILD_FLAG:
        print(json.dumps(csan_child(int(sys.argv[2]))), flush=True)
        sys.stderr.flush()
        # Skip interpreter shutdown: CSAN's hooks must not fail a run that reported.
        os._exit(0)
    sys.exit(f"usage: {sys.argv[0]} {CSAN_CHILD_FLAG} ITERATIONS (run by the tests)")
