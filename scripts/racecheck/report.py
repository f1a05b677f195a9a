"""Races as plain data (no torch), table cells and text, and the verdict on a run."""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from patchset.errors import BackportError, Exit
from patchset.manifest import RACE_KINDS, PinManifest
from patchset.plays import SCENARIOS
from patchset.textout import table

# FutureMap's relay buffers, in report order; an EAGLE row is the first five.
RELAY_BUFFERS = (
    "new_seq_lens_buf",
    "output_tokens_buf",
    "topk_p_buf",
    "topk_index_buf",
    "hidden_states_buf",
    "draft_probs_buf",
    "dsa_topk_indices_buf",
)
EAGLE_ROW = RELAY_BUFFERS[:5]
_ORDER = {buffer: n for n, buffer in enumerate(RELAY_BUFFERS)}
Cell = frozenset[tuple[str, str, int]]  # (kind, buffer, row) of a scenario's races on a step
Table = dict[str, dict[str, Cell]]
# Per kind: its words in a race's report, and in a table cell (with the buffers).
_KINDS = {
    "write/write": ("unordered writes", "unordered writes to {}"),
    "write/read": (
        "read not ordered after the write",
        "unordered read of {} (after another stream's write)",
    ),
    "read/write": ("write not ordered after the read", "write over an unordered read of {}"),
}


class Site(NamedTuple):
    file: str  # relative to its root's parent
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


class Access(NamedTuple):
    kind: str  # "read" or "write"
    stream: str
    operator: str
    code: tuple[Site, ...]  # frames in the code under test, innermost first
    driver: tuple[Site, ...]  # frames in the scenario that drove it, innermost first


class Race(NamedTuple):  # two accesses to one row, on two streams, that nothing orders
    buffer: str
    row: int
    first: Access
    second: Access

    @property
    def kind(self) -> str:  # the first access's kind / the second's: "write/read"
        return f"{self.first.kind}/{self.second.kind}"


def cell_of(races: Iterable[Race]) -> Cell:
    return frozenset((race.kind, race.buffer, race.row) for race in races)


def describe(cell: Cell) -> str:
    parts = [
        _KINDS[kind][1].format(", ".join(buffers))
        + f" in row{'' if len(rows) == 1 else 's'} {', '.join(map(str, rows))}"
        for kind, rows, buffers in entries_of(cell)
    ]
    return "; ".join(parts) or "clean"


def expected_table(manifest: PinManifest, scenarios: Sequence[str]) -> Table:
    """The manifest's [races] table as cells; every scenario must be there."""
    if missing := [name for name in scenarios if name not in manifest.races]:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"the pin manifest's [races] table has no [races.{missing[0]}]"
            + (f" (nor {', '.join(missing[1:])})" if missing[1:] else ""),
            "write the tables from a run: scripts/race-check --write-expected",
        )
    return {
        name: {
            step: frozenset((k, b, r) for k, bufs, rows in entries for b in bufs for r in rows)
            for step, entries in manifest.races[name].items()
        }
        for name in scenarios
    }


def entries_of(cell: Cell) -> list[tuple[str, tuple[int, ...], list[str]]]:
    """A cell as [races] entries (kind, rows, buffers): per kind, one per set of rows."""
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    order = sorted(cell, key=lambda e: (RACE_KINDS.index(e[0]), _ORDER.get(e[1], len(_ORDER)), e))
    for kind, buffer in dict.fromkeys((k, b) for k, b, _ in order):
        rows = tuple(sorted(r for k, b, r in cell if (k, b) == (kind, buffer)))
        groups.setdefault((kind, rows), []).append(buffer)
    return [(kind, rows, buffers) for (kind, rows), buffers in groups.items()]


def table_lines(by_step: Mapping[str, Cell]) -> list[str]:
    entry = "{{ kind = {}, rows = {}, buffers = {} }}"
    return [
        f"{step if step == 'base' else json.dumps(step)} = ["
        + ", ".join(entry.format(*map(json.dumps, e)) for e in entries_of(cell))
        + "]"
        for step, cell in by_step.items()
    ]


def step_label(step: str) -> str:
    return step if step == "base" else f"+{step}"


def race_text(race: Race) -> str:
    lines = [f"{race.buffer} row {race.row}: {_KINDS[race.kind][0]}"]
    for label, access in (("first ", race.first), ("second", race.second)):
        lines.append(f"  {label}: {access.kind} on {access.stream} ({access.operator})")
        lines += [f"          {'from' if n else 'at'} {site}" for n, site in enumerate(access.code)]
        lines += [f"          driven by {site}" for site in access.driver[:1]]
    lines.append(
        f"  nothing (event wait, wait_stream, synchronize) orders {race.second.stream}'s "
        f"{race.second.kind} after {race.first.stream}'s {race.first.kind}"
    )
    return "\n".join(lines)


@dataclass
class TreeRun:
    label: str  # the column: a step label or "tree" (numbered), after the base when several
    step: str  # the step whose expected column judges it; "" for a tree that holds no step
    tree: Path
    expected: Table  # the table of the tree's base
    expected_final: str  # the final step of the tree's series
    version: str = ""  # the release whose series judges it
    given: bool = False  # a --tree (judged as the step its files hold), not a step tree
    races: dict[str, list[Race]] = field(default_factory=dict)
    torch: str = ""
    barrier: str = ""
    import_s: float = 0.0
    run_s: float = 0.0

    @property
    def count(self) -> int:
        return sum(len(races) for races in self.races.values())

    def differ(self) -> list[str]:
        """The scenarios whose measured cell is not the expected one (none without a step)."""
        if not self.step:
            return []
        return [n for n in SCENARIOS if cell_of(self.races[n]) != self.expected[n][self.step]]


def grid_text(runs: list[TreeRun]) -> str:
    """One base's table: a row per scenario, a column per run, differing cells marked."""

    def cell_text(r: TreeRun, name: str) -> str:
        measured = cell_of(r.races[name])
        expected = r.expected[name][r.step] if r.step else measured
        text = describe(measured)
        return text if expected == measured else f"{text} [EXPECTED: {describe(expected)}]"

    rows = [[name, *(cell_text(r, name) for r in runs)] for name in SCENARIOS]
    columns = [r.label.removeprefix(f"{r.version} ") for r in runs]  # each base has its grid
    return table(["scenario", *columns], rows, wrap=36)


def print_races(run: TreeRun) -> None:
    counted = f"{run.count} race{'s' if run.count != 1 else ''} ({run.tree})"
    print(f"{run.label}: {counted if run.count else 'no race'}")
    for name, races in run.races.items():
        for race in races:
            print(f"[{name}] " + race_text(race))
    print()


def verdict(runs: list[TreeRun]) -> int:
    """Steps give the expected table (a patched one no race); a given tree, its step's."""
    code = Exit.OK
    steps = [r for r in runs if not r.given]
    if all(
        r.step == r.expected_final and not any(r.expected[n][r.step] for n in SCENARIOS)
        for r in steps
    ):
        for r in steps:
            if r.count:
                print(f"FAILED: {r.count} race(s) in the patched tree {r.tree}")
                code = Exit.RACE
            else:
                print(f"ok: no race in the patched tree {r.tree}")
    elif differ := [f"{name} {r.label}" for r in steps for name in r.differ()]:
        print("FAILED: the measured table differs from the expected one in: " + ", ".join(differ))
        code = Exit.RACE
    else:
        print("ok: the measured table is the expected one")
    for run in [r for r in runs if r.given]:
        if run.count:
            open_in = ", ".join(name for name in SCENARIOS if run.races[name])
            print(f"races open in this tree {run.tree}: {run.count} ({open_in})")
            code = Exit.RACE
        else:
            print(f"ok: no race in this tree {run.tree}")
        series = f"sglang {run.version}'s series"
        held = f"the series' files in it are step {step_label(run.step)} of {series}"
        if not run.step:
            print(f"  the series' files in it match no step of {series}, so nothing is expected")
        elif differ := ", ".join(run.differ()):
            print(f"  FAILED: {held}, whose [races] table expects otherwise in: {differ}")
            code = Exit.RACE
        else:
            print(f"  {held}, as its [races] table expects")
    return code
