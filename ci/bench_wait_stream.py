#!/usr/bin/env python3
"""What 0002's wait_stream costs per prebuilt batch in a steady decode-like loop: two CUDA
streams in the overlap scheduler's rhythm through the real FutureMap, "patched" (0002's wait
before seeding) and "unpatched" runs alternating; the wait itself and the idle gap it adds, as
shares of decode steps (docs/gpu.md). A measurement, not a test. Run it with an sglang tree on
PYTHONPATH (ci/run-gpu uses the final step's tree)."""

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from gpustage import sglang_import
from gpustage.contract import ARRIVAL_RATES, DECODE_STEPS_MS
from patchset import cli
from patchset.errors import BackportError, Exit
from patchset.textout import table as text_table

POOL_ROWS = 512
MAX_BATCH = POOL_ROWS - 1  # running rows 1..batch, the prebuilt row batch + 1; row 0 pads
TOPK = 4
CODES = {Exit.OK: "measured (and written to --json)"}
INTS = {  # flag: default, help, the least value, said when below it
    "runs": (5, "runs per variant", 2, "at least 2 to give a spread"),
    "iters": (300, "iterations per run", 1, "at least 1"),
    "warmup": (50, "untimed iterations per run (0: none)", 0, "0 or more"),
    "batch": (64, "running requests", 1, "at least 1"),
    "hidden": (8192, "hidden size", 1, "at least 1"),
    "layers": (32, "matmuls per forward", 1, "at least 1"),
}


class RunTimes(NamedTuple):
    seconds_per_iteration: float
    wait_us: Sequence[float] = ()  # host time of each wait_stream call
    gap_us: Sequence[float] = ()  # forward stream idle between forwards


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("bench_wait_stream.py", __doc__ or "", CODES, CODES)
    for name, (default, text, _, _) in INTS.items():
        p.add_argument(f"--{name}", type=int, default=default, help=f"{text} (default {default})")
    p.add_argument("--json", type=cli.absolute_path, metavar="PATH", help="also write them here")
    args = p.parse_args(argv)
    for name, (_, _, least, said) in INTS.items():
        if getattr(args, name) < least:
            p.error(f"--{name} must be {said}")
    if args.batch > MAX_BATCH:
        p.error(f"--batch must be at most {MAX_BATCH} (the pool has {POOL_ROWS} rows)")
    return args


class Loop:
    """Everything one decode-like loop needs, built once and reused by both variants."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        mods = sglang_import.import_modules()  # imported as the GPU test does: no sgl_kernel needed
        overlap = mods["sglang.srt.managers.overlap_utils"]
        eagle = mods["sglang.srt.speculative.eagle_disaggregation"]
        self.build_draft_input = eagle.build_eagle_disagg_draft_input
        self.args = args
        dev = self.device = device
        self.server_args = SimpleNamespace(
            speculative_algorithm="EAGLE",
            enable_multi_layer_eagle=False,
            speculative_eagle_topk=TOPK,
            speculative_num_steps=1,
        )
        mods["sglang.srt.runtime_context"].get_context().set_server_args(self.server_args)
        pool = mods["sglang.srt.mem_cache.memory_pool"].ReqToTokenPool(
            size=POOL_ROWS, max_context_len=8, device=str(dev), enable_memory_saver=False
        )
        spec = mods["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm
        self.future_map = overlap.FutureMap(dev, spec.from_string("EAGLE"), pool)
        self.forward_stream, self.schedule_stream = torch.cuda.Stream(), torch.cuda.Stream()

        b, h = args.batch, args.hidden
        self.weight = torch.randn(h, h, device=dev, dtype=torch.bfloat16) / h**0.5
        self.x = torch.randn(b, h, device=dev, dtype=torch.bfloat16)
        self.running_rows = torch.arange(1, b + 1, dtype=torch.int64, device=dev)
        self.prebuilt_row = b + 1
        self.seq_lens = torch.full((b,), 100, dtype=torch.int64, device=dev)
        self.payload = overlap.RelayPayload(
            bonus_tokens=torch.zeros(b, dtype=torch.int64, device=dev),
            topk_p=torch.rand(b, TOPK, device=dev),
            topk_index=torch.zeros(b, TOPK, dtype=torch.int64, device=dev),
            hidden_states=torch.zeros(b, h, device=dev, dtype=torch.bfloat16),
        )
        self.future_map.publish(self.running_rows, self.seq_lens)
        self.future_map.stash(self.running_rows, self.payload)
        torch.cuda.synchronize()

    def _seed(self, i: int, patched: bool) -> float:
        """Seed one prebuilt batch; the host time of the wait_stream call in us (0: none)."""
        dev = self.device
        req = SimpleNamespace(
            output_topk_p=[0.5] * TOPK,
            output_topk_index=list(range(TOPK)),
            hidden_states_tensor=torch.zeros(self.args.hidden, dtype=torch.bfloat16),
            output_dsa_topk_indices=None,
        )
        batch = SimpleNamespace(
            reqs=[req],
            device=dev,
            enable_overlap=True,
            # process_prebuilt's inputs, built before its wait as in get_new_prebuilt_batch
            req_pool_indices=torch.tensor([self.prebuilt_row], dtype=torch.int64, device=dev),
            seq_lens=torch.tensor([100 + i % 7], dtype=torch.int64, device=dev),
        )
        waited = 0.0
        if patched:
            start = time.perf_counter()
            self.schedule_stream.wait_stream(self.forward_stream)
            waited = (time.perf_counter() - start) * 1e6
        last_tokens = torch.tensor([i % 1000], dtype=torch.int64, device=dev)
        self.build_draft_input(batch, self.server_args, last_tokens, self.future_map)
        return waited

    def run(self, iterations: int, patched: bool) -> RunTimes:
        """Time `iterations` steady iterations: per iteration, the wait call, the idle gaps."""
        waits: list[float] = []
        marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # forward start, end
        start = time.perf_counter()
        for i in range(iterations):
            with torch.cuda.stream(self.schedule_stream):
                waits.append(self._seed(i, patched))
                ready = self.schedule_stream.record_event()
            self.forward_stream.wait_event(ready)
            began, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.forward_stream):
                began.record()
                y = self.x
                for _ in range(self.args.layers):
                    y = y @ self.weight
                self.future_map.publish(self.running_rows, self.seq_lens)
                self.future_map.stash(self.running_rows, self.payload)
                done.record()
            marks.append((began, done))
            if len(marks) > 1:  # one iteration in flight: wait for the previous forward
                marks[-2][1].synchronize()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iterations
        gaps = [marks[k - 1][1].elapsed_time(marks[k][0]) * 1e3 for k in range(1, len(marks))]
        return RunTimes(seconds, waits if patched else [], gaps)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def shares(wait_us: float, gap_us: float, step_ms: float) -> list[dict[str, Any]]:
    """The wait and the idle gap as a share of a decode step, at each arrival rate: of the
    loop's synthetic step (step_ms) and of real decode steps (DECODE_STEPS_MS)."""
    return [
        {
            "step_ms": step,
            "synthetic": synthetic,
            "rate": rate,
            "wait": rate * wait_us / (step * 1e3),
            "idle_gap": rate * gap_us / (step * 1e3),
        }
        for step, synthetic in ((step_ms, True), *((s, False) for s in DECODE_STEPS_MS))
        for rate in ARRIVAL_RATES
    ]


def time_pairs(run: Callable[[int, bool], RunTimes], args: argparse.Namespace) -> dict[str, Any]:
    """Alternate unpatched and patched runs; run(iterations, patched) times one run."""
    times: dict[str, list[float]] = {"unpatched": [], "patched": []}
    gaps: dict[str, list[float]] = {"unpatched": [], "patched": []}
    waits: list[float] = []
    for _ in range(args.runs):
        for variant in ("unpatched", "patched"):
            if args.warmup:
                run(args.warmup, variant == "patched")
            timed = run(args.iters, variant == "patched")
            times[variant].append(timed.seconds_per_iteration)
            gaps[variant] += timed.gap_us
            waits += timed.wait_us
    pairs = list(zip(times["unpatched"], times["patched"], strict=True))
    ratios = [patched / unpatched for unpatched, patched in pairs]
    deltas = [(patched - unpatched) * 1e3 for unpatched, patched in pairs]
    ms = {v: {k: x * 1e3 for k, x in spread(ts).items()} for v, ts in times.items()}
    gap = {v: statistics.median(g) if g else 0.0 for v, g in gaps.items()}
    gap["added"] = gap["patched"] - gap["unpatched"]
    wait = spread(waits) if waits else {"median": 0.0, "min": 0.0, "max": 0.0}
    return {
        "step_ms": ms["unpatched"]["median"],
        "wait_us": wait,
        "idle_gap_us": gap,
        "shares": shares(wait["median"], gap["added"], ms["unpatched"]["median"]),
        "config": {k: getattr(args, k) for k in INTS},
        "ms_per_iteration": ms,
        "ratio": spread(ratios),
        "ratios": ratios,
        # patched - unpatched, milliseconds per iteration, per run pair
        "delta_ms": spread(deltas),
        "deltas_ms": deltas,
    }


def table(result: dict[str, Any]) -> str:
    def spread_row(name: str, values: dict[str, float], form: str = ".4f") -> tuple[str, ...]:
        return (name, *(f"{values[k]:{form}}" for k in ("median", "min", "max")))

    ms, gap = result["ms_per_iteration"], result["idle_gap_us"]
    rows = [
        *(spread_row(variant, ms[variant]) for variant in ("unpatched", "patched")),
        spread_row("patched - unpatched ms", result["delta_ms"]),
        spread_row("patched/unpatched", result["ratio"]),
        spread_row("the wait itself, us (host)", result["wait_us"], ".2f"),
        *((f"idle gap, us ({v})", f"{gap[v]:.2f}", "", "") for v in ("patched", "unpatched")),
    ]
    for share in result["shares"]:
        step = "this loop's" if share["synthetic"] else f"a {share['step_ms']:g} ms"
        name = f"share of {step} step at {share['rate']:g} prebuilt/step"
        rows.append((name, f"wait {share['wait']:.4%}", f"gap {share['idle_gap']:.4%}", ""))
    cfg = result["config"]
    head = (
        f"wait_stream cost per prebuilt batch on {result['device']} (torch {result['torch']}): "
        f"{cfg['runs']} runs x {cfg['iters']} iterations, batch {cfg['batch']}, "
        f"hidden {cfg['hidden']}, {cfg['layers']} layers; ratio spread is over run pairs"
    )
    return "\n".join([head, text_table(("variant", "median ms/iter", "min", "max"), rows)])


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        raise BackportError(
            Exit.ENVIRONMENT,
            "bench_wait_stream.py needs a CUDA device (torch.cuda.is_available() is False): "
            "it times two real CUDA streams",
            "run it on a GPU machine, e.g. through ci/run-gpu",
        )
    if importlib.util.find_spec("sglang") is None:
        raise BackportError(
            Exit.ENVIRONMENT,
            "sglang is not importable",
            "put a step tree first on PYTHONPATH (e.g. PYTHONPATH=build/steps/VERSION/STEP/python)",
        )
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result |= time_pairs(Loop(args, torch.device("cuda", torch.cuda.current_device())).run, args)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return Exit.OK


if __name__ == "__main__":
    cli.run(main)
