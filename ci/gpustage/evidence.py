"""What a GPU run measured, each figure beside its expected value; the criteria; the tarball.

The success criteria are fixed here, before any run (issue 23), and written
into the reports folder before the first stage. The figures come from what
the stages left there: each pytest stage's outcome file (the S1 tally with its
measured sleep, the CSAN report, kept as recorded properties), bench.json and
facts.json.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

from patchset import textout
from patchset.manifest import PinManifest
from testrun.outcomes import read_outcomes

from . import contract
from . import facts as machine
from .stages import SUMMARY_FILE

CRITERIA_FILE = "criteria.md"
BENCH_FILE = "bench.json"
MIN_RACE_SHARE = 0.9
ARRIVAL_RATES = (1.0, 0.1, 0.01)  # prebuilt batches per decode step; 1 is today's upper bound
DECODE_STEPS_MS = (5.0, 10.0, 30.0)  # real decode steps (the benchmark's own is about 1 ms)

CRITERIA = f"""\
## Success criteria (written down before the run)

- Base step (neither fix): the stale value wins in at least {MIN_RACE_SHARE:.0%} of the
  {contract.S1_MIN_ITERATIONS} S1 iterations, for every field.
- Step with fix A only (0001): S1 still loses the seed (fix A orders the consumer's read,
  not the two writes): seq_len stale in at least {MIN_RACE_SHARE:.0%}; the split of the
  stash fields is reported.
- Step with fix B (0002): the seed wins every iteration ({contract.S1_MIN_ITERATIONS} and
  1,000) with no torn row.
- CSAN reports a race on the base step and on 0001, and stays silent on 0002.
- Controls on the base step: with the forward not held back (sleep 0) the seed wins in at
  least {MIN_RACE_SHARE:.0%} of the iterations (the race needs a late forward);
  CUDA_DEVICE_MAX_CONNECTIONS=1 hides the race (the seed wins every iteration).
- The sleep that holds the forward back is measured on a warm GPU and reported beside
  each S1 result, with the GPU's clocks read after the warm-up; the benchmark reports the
  wait itself and the idle gap apart, in us and as a share of a decode step at
  {", ".join(f"{r:g}" for r in ARRIVAL_RATES)} prebuilt batches per step (1: every step
  admits one, today's upper bound), of its own synthetic step (about 1 ms: the share
  overstates) and of real decode steps of {", ".join(f"{s:g}" for s in DECODE_STEPS_MS)} ms.
  They are measurements, with no threshold.
"""


def outputs(reports: Path, stage_names: list[str]) -> list[Path]:
    """Every file a run writes into reports: a new run removes an earlier run's first,
    so that no figure of another run is read or packed."""
    files = [reports / f"{n}{ext}" for n in stage_names for ext in (".log", ".json", ".xml")]
    names = (CRITERIA_FILE, machine.FILE, BENCH_FILE, SUMMARY_FILE)
    return files + [reports / name for name in names]


def write_criteria(reports: Path) -> Path:
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / CRITERIA_FILE
    path.write_text(CRITERIA, encoding="utf-8")
    return path


def _property(reports: Path, stage: str, name: str) -> dict[str, Any] | None:
    value = read_outcomes(reports / f"{stage}.json")[1].get(name)
    return json.loads(value) if value else None


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({n / of:.1%})" if of else f"{n}/0"


def _sleep(s1: dict[str, Any]) -> str:
    slept = s1.get("slept_ms") or {}
    if not slept:
        return "not measured"
    return (
        f"{slept['median']:.2f} ms median ({slept['min']:.2f}..{slept['max']:.2f}) for "
        f"{s1['sleep_target_ms']:g} ms asked"
    )


NOT_RUN = "not run (no record: see the stage table)"


def s1_rows(label: str, s1: dict[str, Any] | None, fixes: Collection[str]) -> list[tuple[str, ...]]:
    """Rows for one S1 record, judged by what the step holds."""
    rows: list[tuple[str, ...]] = []
    if "fix-b" in fixes:
        name, expected = "S1 seed kept", "every iteration, no torn row"
    elif "fix-a" in fixes:
        name, expected = "S1 seq_len stale", f">= {MIN_RACE_SHARE:.0%}"
    else:
        name, expected = "S1 stale per field", f">= {MIN_RACE_SHARE:.0%} every field"
    if s1 is None:
        return [(f"{label}: {name}", NOT_RUN, expected, "no")]
    n = s1["iterations"]
    stale = s1["stale_fields"]
    need = MIN_RACE_SHARE * n
    split = ", ".join(f"{k} {_share(v, n)}" for k, v in stale.items())
    if "fix-b" in fixes:
        met = s1["seed_won"] == n and s1["torn"] == 0 and s1["running_row_wrong"] == 0
        seen = f"{_share(s1['seed_won'], n)}; torn rows {s1['torn']}"
    elif "fix-a" in fixes:
        met = stale["seq_len"] >= need
        seen = _share(stale["seq_len"], n)
    else:
        met = all(v >= need for v in stale.values())
        seen = f"{split}; torn {s1['torn']}"
    rows.append((f"{label}: {name}", seen, expected, "yes" if met else "NO"))
    if "fix-a" in fixes and "fix-b" not in fixes:
        rows.append(
            (f"{label}: S1 stash fields stale", f"{split}; torn {s1['torn']}", "reported", "yes")
        )
    rows.append((f"{label}: measured sleep", _sleep(s1), "about the asked time, warm", "reported"))
    if s1.get("clocks_warm"):
        rows.append(
            (f"{label}: clocks after the warm-up", s1["clocks_warm"], "near the max", "reported")
        )
    return rows


def sleep0_rows(label: str, s1: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """The control with the forward not held back: the seed must win (the race needs a late
    forward)."""
    name, expected = "S1 seed kept, forward not held back", f">= {MIN_RACE_SHARE:.0%}"
    if s1 is None:
        return [(f"{label}: {name}", NOT_RUN, expected, "no")]
    n = s1["iterations"]
    met = s1["seed_won"] >= MIN_RACE_SHARE * n and s1["running_row_wrong"] == 0
    seen = f"{_share(s1['seed_won'], n)}; torn rows {s1['torn']}"
    return [(f"{label}: {name}", seen, expected, "yes" if met else "NO")]


def _csan_row(label: str, csan: dict[str, Any] | None, fixed: bool) -> tuple[str, ...]:
    expected = "silent" if fixed else "race reported"
    if csan is None:
        return (f"{label}: CSAN", NOT_RUN, expected, "no")
    if "error" in csan:
        return (f"{label}: CSAN", f"error: {csan['error']}", expected, "NO")
    if csan["race"]:
        seen = f"race at iteration {csan['iteration']} on {', '.join(csan['buffers'])}"
    else:
        seen = f"silent over {csan['iterations']} iterations"
    return (f"{label}: CSAN", seen, expected, "yes" if csan["race"] is not fixed else "NO")


def _bench_rows(bench: dict[str, Any] | None) -> list[tuple[str, ...]]:
    if bench is None:
        return [("benchmark", NOT_RUN, "measured", "no")]
    step = bench["step_ms"]
    rows: list[tuple[str, ...]] = [
        ("benchmark: decode step (unpatched)", f"{step:.3f} ms", "measured", "reported"),
        (
            "benchmark: the wait itself",
            f"{bench['wait_us']['median']:.1f} us per prebuilt batch (host)",
            "measured",
            "reported",
        ),
        (
            "benchmark: idle gap",
            f"{bench['idle_gap_us']['added']:.1f} us per prebuilt batch (GPU idle, patched "
            f"{bench['idle_gap_us']['patched']:.1f} - unpatched "
            f"{bench['idle_gap_us']['unpatched']:.1f})",
            "measured",
            "reported",
        ),
    ]
    rates = " / ".join(f"{r:g}" for r in ARRIVAL_RATES)
    by_step: dict[tuple[float, bool], list[dict[str, Any]]] = {}
    for share in bench["shares"]:
        by_step.setdefault((share["step_ms"], share.get("synthetic", True)), []).append(share)
    for (step_ms, synthetic), found in by_step.items():
        step = (
            f"the loop's synthetic {step_ms:.2f} ms step" if synthetic else f"a {step_ms:g} ms step"
        )
        waits = " / ".join(f"{s['wait']:.3%}" for s in found)
        gaps = " / ".join(f"{s['idle_gap']:.3%}" for s in found)
        rows.append(
            (
                f"benchmark: share of {step} at {rates} prebuilt/step",
                f"wait {waits}; idle gap {gaps}",
                "measured" + (" (overstated: real steps are 5 to 30 ms)" if synthetic else ""),
                "reported",
            )
        )
    return rows


def figures(reports: Path, manifest: PinManifest, stage_names: list[str]) -> str:
    """The figures of a run, as markdown: figure | measured | expected | met."""
    step_fixes = manifest.step_fixes
    base, final = manifest.steps[0], manifest.final_step
    rows: list[tuple[str, ...]] = []
    found = _json(reports / machine.FILE)
    if found:
        versions = found.get("versions") or {}
        rows.append(
            (
                "machine",
                f"{versions.get('device') or 'no CUDA device'}; torch {versions.get('torch')}, "
                f"triton {versions.get('triton')}; git: {found.get('git') or 'none'}",
                "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0",
                "reported",
            )
        )
        if found.get("clocks"):
            rows.append(
                ("clocks before the GPU stages", found["clocks"].replace("\n", "; "), "", "")
            )
    for step in manifest.steps:
        fixes = step_fixes.get(step, frozenset())
        rows += s1_rows(
            f"step {step}", _property(reports, f"gpu-{step}", contract.S1_PROPERTY), fixes
        )
        rows.append(
            _csan_row(
                f"step {step}",
                _property(reports, f"gpu-{step}", contract.CSAN_PROPERTY),
                "fix-b" in fixes,
            )
        )
    rows += s1_rows(
        f"step {final}, long run",
        _property(reports, f"gpu-{final}-long", contract.S1_PROPERTY),
        step_fixes.get(final, frozenset()),
    )
    rows += sleep0_rows(
        f"control {base}, sleep 0", _property(reports, "control-sleep-0", contract.S1_PROPERTY)
    )
    rows += s1_rows(
        f"control {base}, 1 connection (hides the race)",
        _property(reports, "control-1", contract.S1_PROPERTY),
        {"fix-b"},  # judged as a fixed step: the seed must win every iteration
    )
    if "bench" in stage_names:
        rows += _bench_rows(_json(reports / BENCH_FILE))
    table = textout.table(("figure", "measured", "expected", "met"), rows, markdown=True)
    criteria = (reports / CRITERIA_FILE).read_text(encoding="utf-8")
    return f"## Figures, each beside its expected value\n\n{table}\n\n{criteria}"


def pack(reports: Path, tarball: Path) -> Path:
    """Every report of the run in one .tar.gz, under the folder's own name."""
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(tarball.name + ".partial")
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(reports, arcname=reports.name)
    partial.replace(tarball)
    return tarball
