"""What a GPU run measured (outcome files, bench.json, facts.json), each figure beside its
expected value; the criteria, fixed here and written before the first stage; the tarball."""

import json
import shutil
import subprocess
import tarfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

from patchset import textout
from patchset.manifest import PinManifest
from testrun.outcomes import read_outcomes

from .contract import ARRIVAL_RATES, CSAN_PROPERTY, DECODE_STEPS_MS, S1_MIN_ITERATIONS, S1_PROPERTY
from .stages import SUMMARY_FILE

FACTS_FILE, CRITERIA_FILE, BENCH_FILE = "facts.json", "criteria.md", "bench.json"
CLOCKS = "name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw"
VERSIONS = (
    "import json, torch\n"
    "try:\n    import triton; t = triton.__version__\nexcept ImportError:\n    t = None\n"
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'triton': t,"
    " 'device': torch.cuda.get_device_name() if torch.cuda.is_available() else None}))"
)


def output(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def python_version(python: str) -> str | None:
    """X.Y of the Python python names (a path or a name on PATH), or None where it fails."""
    return output([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])


def clocks() -> str | None:
    """The GPU's clocks now (idle at the start, warm after the S1 tests' warm-up), CSV."""
    return output(["nvidia-smi", f"--query-gpu={CLOCKS}", "--format=csv"])


def describe(found: dict[str, Any]) -> str:
    """The machine in one line, from what record wrote."""
    versions = found.get("versions") or {}
    return (
        f"{versions.get('device') or 'no CUDA device'}; torch {versions.get('torch')}, "
        f"triton {versions.get('triton')}; git: {found.get('git') or 'none'}"
    )


def record(python: str, reports: Path) -> tuple[bool, str]:
    """Write facts.json into reports; the stage's result line. Missing facts are said, not fatal."""
    versions = output([python, "-c", VERSIONS])
    found = {
        "nvidia_smi": output(["nvidia-smi"]),
        "clocks": clocks(),
        "python": output([python, "--version"]),
        "versions": json.loads(versions) if versions else None,
        "git": shutil.which("git"),  # `command -v git`: the runner may have none
    }
    (reports / FACTS_FILE).write_text(json.dumps(found, indent=2) + "\n", encoding="utf-8")
    return True, f"ok: {describe(found)}; nvidia-smi: {'yes' if found['nvidia_smi'] else 'none'}"


MIN_RACE_SHARE = 0.9
CRITERIA = f"""\
## Success criteria (written down before the run)

- Base step (neither fix): the stale value wins in at least {MIN_RACE_SHARE:.0%} of the
  {S1_MIN_ITERATIONS} S1 iterations, for every field.
- Step with fix A only (0001): S1 still loses the seed (fix A orders the consumer's read,
  not the two writes): seq_len stale in at least {MIN_RACE_SHARE:.0%}; the split of the
  stash fields is reported.
- Step with fix B (0002): the seed wins every iteration ({S1_MIN_ITERATIONS} and
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
NOT_RUN = "not run (no record: see the stage table)"
SLEEP_0 = "sleep-0"  # judged as the control with the forward not held back
# What an S1 record is judged by, by the fixes of its step: the figure and what it must show.
S1_FIGURES = {
    SLEEP_0: ("S1 seed kept, forward not held back", f">= {MIN_RACE_SHARE:.0%}"),
    "fix-b": ("S1 seed kept", "every iteration, no torn row"),
    "fix-a": ("S1 seq_len stale", f">= {MIN_RACE_SHARE:.0%}"),
    "": ("S1 stale per field", f">= {MIN_RACE_SHARE:.0%} every field"),
}


def write_criteria(reports: Path, stage_names: Collection[str] = ()) -> None:
    """Remove what a run writes into reports (no other run's figure is read); write the criteria."""
    names = [f"{n}{ext}" for n in stage_names for ext in (".log", ".json", ".xml")]
    for name in [*names, CRITERIA_FILE, FACTS_FILE, BENCH_FILE, SUMMARY_FILE]:
        (reports / name).unlink(missing_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / CRITERIA_FILE).write_text(CRITERIA, encoding="utf-8")


def _property(reports: Path, stage: str, name: str = S1_PROPERTY) -> dict[str, Any] | None:
    value = read_outcomes(reports / f"{stage}.json")[1].get(name)
    return json.loads(value) if value else None


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({n / of:.1%})" if of else f"{n}/0"


def s1_rows(label: str, s1: dict[str, Any] | None, fixes: Collection[str]) -> list[tuple[str, ...]]:
    """Rows for one S1 record, judged by what the step holds (or as the sleep-0 control)."""
    kind = next((k for k in S1_FIGURES if k in fixes), "")
    name, expected = S1_FIGURES[kind]
    if s1 is None:
        return [(f"{label}: {name}", NOT_RUN, expected, "no")]
    n, stale, torn, won = s1["iterations"], s1["stale_fields"], s1["torn"], s1["seed_won"]
    need, clean = MIN_RACE_SHARE * n, s1["running_row_wrong"] == 0
    split = ", ".join(f"{k} {_share(v, n)}" for k, v in stale.items()) + f"; torn {torn}"
    seen = f"{_share(won, n)}; torn rows {torn}"
    if kind == SLEEP_0:
        return [(f"{label}: {name}", seen, expected, "yes" if won >= need and clean else "NO")]
    if kind == "fix-b":
        met = won == n and torn == 0 and clean
    elif kind == "fix-a":
        met, seen = stale["seq_len"] >= need, _share(stale["seq_len"], n)
    else:
        met, seen = all(v >= need for v in stale.values()), split
    rows = [(f"{label}: {name}", seen, expected, "yes" if met else "NO")]
    if kind == "fix-a":
        rows.append((f"{label}: S1 stash fields stale", split, "reported", "yes"))
    sleep = "not measured"
    if slept := s1.get("slept_ms"):
        sleep = f"{slept['median']:.2f} ms median ({slept['min']:.2f}..{slept['max']:.2f}) for "
        sleep += f"{s1['sleep_target_ms']:g} ms asked"
    rows.append((f"{label}: measured sleep", sleep, "about the asked time, warm", "reported"))
    if warm := s1.get("clocks_warm"):
        rows.append((f"{label}: clocks after the warm-up", warm, "near the max", "reported"))
    return rows


def _csan_row(label: str, csan: dict[str, Any] | None, fixed: bool) -> tuple[str, ...]:
    seen, met = NOT_RUN, "no"
    if csan and "error" in csan:
        seen, met = f"error: {csan['error']}", "NO"
    elif csan and csan["race"]:
        seen = f"race at iteration {csan['iteration']} on {', '.join(csan['buffers'])}"
        met = "NO" if fixed else "yes"
    elif csan:
        seen, met = f"silent over {csan['iterations']} iterations", "yes" if fixed else "NO"
    return (f"{label}: CSAN", seen, "silent" if fixed else "race reported", met)


def _bench_rows(bench: dict[str, Any] | None) -> list[tuple[str, ...]]:
    if bench is None:
        return [("benchmark", NOT_RUN, "measured", "no")]
    wait, gap = bench["wait_us"]["median"], bench["idle_gap_us"]
    idle = f"{gap['added']:.1f} us per prebuilt batch (GPU idle, patched {gap['patched']:.1f}"
    idle += f" - unpatched {gap['unpatched']:.1f})"
    rows = [
        ("benchmark: decode step (unpatched)", f"{bench['step_ms']:.3f} ms", "measured"),
        ("benchmark: the wait itself", f"{wait:.1f} us per prebuilt batch (host)", "measured"),
        ("benchmark: idle gap", idle, "measured"),
    ]
    rates = " / ".join(f"{r:g}" for r in ARRIVAL_RATES)
    by_step: dict[tuple[float, bool], list[dict[str, Any]]] = {}
    for share in bench["shares"]:
        by_step.setdefault((share["step_ms"], share.get("synthetic", True)), []).append(share)
    for (ms, synthetic), found in by_step.items():
        step = f"the loop's synthetic {ms:.2f} ms step" if synthetic else f"a {ms:g} ms step"
        name = f"benchmark: share of {step} at {rates} prebuilt/step"
        waits = " / ".join(f"{s['wait']:.3%}" for s in found)
        gaps = " / ".join(f"{s['idle_gap']:.3%}" for s in found)
        expected = "measured" + (" (overstated: real steps are 5 to 30 ms)" if synthetic else "")
        rows.append((name, f"wait {waits}; idle gap {gaps}", expected))
    return [(*row, "reported") for row in rows]


def figures(reports: Path, manifest: PinManifest, stage_names: list[str]) -> str:
    base, final = manifest.steps[0], manifest.final_step
    step_fixes = {step: manifest.step_fixes.get(step, frozenset()) for step in manifest.steps}
    rows: list[tuple[str, ...]] = []
    if found := _json(reports / FACTS_FILE):
        expected = "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0"
        rows.append(("machine", describe(found), expected, "reported"))
        if clocks := found.get("clocks"):
            rows.append(("clocks before the GPU stages", clocks.replace("\n", "; "), "", ""))
    for step, fixes in step_fixes.items():
        rows += s1_rows(f"step {step}", _property(reports, f"gpu-{step}"), fixes)
        csan = _property(reports, f"gpu-{step}", CSAN_PROPERTY)
        rows.append(_csan_row(f"step {step}", csan, "fix-b" in fixes))
    for label, stage, fixes in (
        (f"step {final}, long run", f"gpu-{final}-long", step_fixes[final]),
        (f"control {base}, sleep 0", "control-sleep-0", {SLEEP_0}),
        # judged as a fixed step: the seed must win every iteration
        (f"control {base}, 1 connection (hides the race)", "control-1", {"fix-b"}),
    ):
        rows += s1_rows(label, _property(reports, stage), fixes)
    if "bench" in stage_names:
        rows += _bench_rows(_json(reports / BENCH_FILE))
    table = textout.table(("figure", "measured", "expected", "met"), rows, markdown=True)
    criteria = (reports / CRITERIA_FILE).read_text(encoding="utf-8")
    return f"## Figures, each beside its expected value\n\n{table}\n\n{criteria}"


def pack(reports: Path, tarball: Path) -> Path:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(tarball.name + ".partial")
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(reports, arcname=reports.name)
    partial.replace(tarball)
    return tarball
