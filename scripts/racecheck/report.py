"""Races as data (for the trip between processes), table cells, readable text, and the
verdict on what a run measured."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import RACE_KINDS, PinManifest, RaceEntry
from patchset.textout import table

from .catalogue import SCENARIOS
from .races import RELAY_BUFFERS, Access, Race, Site

CLEAN = "clean"

# A cell is the set of (kind, buffer, row) of the races a scenario shows on a
# step, kind being the first access and the second ("write/write", ...).
Cell = frozenset[tuple[str, str, int]]
Table = dict[str, dict[str, Cell]]

_KIND_TEXT = {
    "write/write": "unordered writes to {}",
    "write/read": "unordered read of {} (after another stream's write)",
    "read/write": "write over an unordered read of {}",
}


def cell_of(races: Iterable[Race]) -> Cell:
    return frozenset((race.kind, race.buffer, race.row) for race in races)


def describe(cell: Cell) -> str:
    """A cell in words: per kind, the buffers and the rows they race in."""
    if not cell:
        return CLEAN
    parts = []
    for entry in entries_of(cell):
        rows = entry["rows"]
        noun = "row" if len(rows) == 1 else "rows"
        parts.append(
            _KIND_TEXT[entry["kind"]].format(", ".join(entry["buffers"]))
            + f" in {noun} "
            + ", ".join(map(str, rows))
        )
    return "; ".join(parts)


def _buffer_rank(name: str) -> tuple[int, str]:
    return (RELAY_BUFFERS.index(name) if name in RELAY_BUFFERS else len(RELAY_BUFFERS), name)


def expected_table(manifest: PinManifest, scenarios: Sequence[str]) -> Table:
    """The manifest's [races] table as cells: per scenario and step, the races left open.

    pin.toml's loader checked each entry ({kind, buffers, rows}: every buffer
    races in every row with that kind); here every scenario must be there.
    """
    missing = [name for name in scenarios if name not in manifest.races]
    if missing:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"the pin manifest's [races] table has no [races.{missing[0]}]"
            + (f" (nor {', '.join(missing[1:])})" if missing[1:] else ""),
            "write the tables from a run: scripts/race-check --write-expected",
        )
    return {
        name: {step: cell_of_entries(entries) for step, entries in manifest.races[name].items()}
        for name in scenarios
    }


def cell_of_entries(entries: Iterable[RaceEntry]) -> Cell:
    return frozenset((kind, b, r) for kind, buffers, rows in entries for b in buffers for r in rows)


def entries_of(cell: Cell) -> list[dict[str, Any]]:
    """A cell as [races] entries: per kind, one entry per set of rows, buffers in
    report order (the form scripts/race-check --write-expected writes)."""
    entries = []
    for kind in RACE_KINDS:
        rows_of: dict[str, set[int]] = {}
        for k, buffer, row in cell:
            if k == kind:
                rows_of.setdefault(buffer, set()).add(row)
        groups: dict[tuple[int, ...], list[str]] = {}
        for buffer in sorted(rows_of, key=_buffer_rank):
            groups.setdefault(tuple(sorted(rows_of[buffer])), []).append(buffer)
        entries += [
            {"kind": kind, "rows": list(rows), "buffers": buffers}
            for rows, buffers in groups.items()
        ]
    return entries


def table_lines(by_step: Mapping[str, Cell]) -> list[str]:
    """One [races.NAME] table's key lines, as pin.toml spells them."""
    lines = []
    for step, cell in by_step.items():
        key = step if step == "base" else json.dumps(step)
        entries = ", ".join(
            f"{{ kind = {json.dumps(e['kind'])}, rows = {json.dumps(e['rows'])}, "
            f"buffers = {json.dumps(e['buffers'])} }}"
            for e in entries_of(cell)
        )
        lines.append(f"{key} = [{entries}]")
    return lines


def step_label(step: str) -> str:
    return step if step == "base" else f"+{step}"


def grid(columns: Sequence[str], cells: Mapping[str, Mapping[str, str]], width: int = 36) -> str:
    """A text table: one row per scenario, one column per entry of columns, cells wrapped."""
    rows = [[name, *(cells[name].get(col, "-") for col in columns)] for name in cells]
    return table(["scenario", *columns], rows, wrap=width)


def race_text(race: Race) -> str:
    kind = {
        "write/write": "unordered writes",
        "write/read": "read not ordered after the write",
        "read/write": "write not ordered after the read",
    }[race.kind]
    lines = [f"{race.buffer} row {race.row}: {kind}"]
    lines += _access_text("first ", race.first)
    lines += _access_text("second", race.second)
    lines.append(
        f"  nothing (event wait, wait_stream, synchronize) orders {race.second.stream}'s "
        f"{race.second.kind} after {race.first.stream}'s {race.first.kind}"
    )
    return "\n".join(lines)


def _access_text(label: str, access: Access) -> list[str]:
    lines = [f"  {label}: {access.kind} on {access.stream} ({access.operator})"]
    for n, site in enumerate(access.code):
        lines.append(f"          {'at' if n == 0 else 'from'} {site}")
    if access.driver:
        lines.append(f"          driven by {access.driver[0]}")
    return lines


def race_to_json(race: Race) -> dict[str, Any]:
    return {
        "buffer": race.buffer,
        "row": race.row,
        "first": _access_to_json(race.first),
        "second": _access_to_json(race.second),
    }


def race_from_json(data: Mapping[str, Any]) -> Race:
    return Race(
        data["buffer"],
        int(data["row"]),
        _access_from_json(data["first"]),
        _access_from_json(data["second"]),
    )


def _access_to_json(access: Access) -> dict[str, Any]:
    return {
        "kind": access.kind,
        "stream": access.stream,
        "operator": access.operator,
        "code": [[s.file, s.line, s.function] for s in access.code],
        "driver": [[s.file, s.line, s.function] for s in access.driver],
    }


def _access_from_json(data: Mapping[str, Any]) -> Access:
    return Access(
        kind=data["kind"],
        stream=data["stream"],
        operator=data["operator"],
        code=tuple(Site(f, int(n), fn) for f, n, fn in data["code"]),
        driver=tuple(Site(f, int(n), fn) for f, n, fn in data["driver"]),
    )


# --- the columns of a run and the verdict on them ----------------------------------


@dataclass
class TreeRun:
    label: str  # the column: a step label, or "tree" (numbered when several)
    step: str  # the step whose expected column judges it; "" for a tree that holds no step
    tree: Path
    expected: Table  # the table of the tree's base
    expected_final: str  # the final step of the tree's series
    base: str = ""  # the base's version, in the labels when several bases run
    given: bool = False  # a --tree (judged as the step its files hold), not a step tree
    version: str = ""  # the release whose series judges it
    races: dict[str, list[Race]] = field(default_factory=dict)
    torch: str = ""
    barrier: str = ""
    import_s: float = 0.0
    run_s: float = 0.0


def grid_text(runs: list[TreeRun]) -> str:
    cells: dict[str, dict[str, str]] = {}
    for name in SCENARIOS:
        row: dict[str, str] = {}
        for tree_run in runs:
            measured = cell_of(tree_run.races[name])
            text = describe(measured)
            expected = tree_run.expected[name][tree_run.step] if tree_run.step else measured
            if expected != measured:
                text = f"{text} [EXPECTED: {describe(expected)}]"
            row[_column(tree_run)] = text
        cells[name] = row
    return grid([_column(r) for r in runs], cells)


def _column(tree_run: TreeRun) -> str:
    """The run's label without its base (each base has a grid of its own)."""
    return tree_run.label.removeprefix(f"{tree_run.base} ")


def print_races(tree_run: TreeRun) -> None:
    count = sum(len(races) for races in tree_run.races.values())
    if not count:
        print(f"{tree_run.label}: no race\n")
        return
    print(f"{tree_run.label}: {count} race{'s' if count != 1 else ''} ({tree_run.tree})")
    for name, races in tree_run.races.items():
        for race in races:
            print(f"[{name}] " + race_text(race))
    print()


def _judged_as_patched(tree_run: TreeRun) -> bool:
    """The final step when its expected column is clean."""
    clean = not any(tree_run.expected[name][tree_run.step] for name in SCENARIOS)
    return tree_run.step == tree_run.expected_final and clean


def _differ(tree_run: TreeRun) -> list[str]:
    """The scenarios whose measured cell is not the expected one (none without a step)."""
    if not tree_run.step:
        return []
    return [
        name
        for name in SCENARIOS
        if cell_of(tree_run.races[name]) != tree_run.expected[name][tree_run.step]
    ]


def verdict(runs: list[TreeRun]) -> int:
    """A table of steps must be the expected one; a patched step tree must have no race;
    a given tree has what it has, and is wrong where the step its files hold expects
    otherwise."""
    code = Exit.OK
    steps = [r for r in runs if not r.given]
    if steps and not all(_judged_as_patched(r) for r in steps):
        differ = [f"{name} {r.label}" for r in steps for name in _differ(r)]
        if differ:
            print(
                "FAILED: the measured table differs from the expected one in: " + ", ".join(differ)
            )
            code = Exit.RACE
        else:
            print("ok: the measured table is the expected one")
    else:
        for r in steps:
            count = sum(len(races) for races in r.races.values())
            if count:
                print(f"FAILED: {count} race(s) in the patched tree {r.tree}")
                code = Exit.RACE
            else:
                print(f"ok: no race in the patched tree {r.tree}")
    for r in (r for r in runs if r.given):
        code = max(code, _given_verdict(r))
    return code


def _given_verdict(tree_run: TreeRun) -> int:
    """What a given tree holds: its open races, and the expectation of its step if any."""
    open_in = [name for name in SCENARIOS if tree_run.races[name]]
    count = sum(len(tree_run.races[name]) for name in open_in)
    if count:
        print(f"races open in this tree {tree_run.tree}: {count} ({', '.join(open_in)})")
    else:
        print(f"ok: no race in this tree {tree_run.tree}")
    series = f"sglang {tree_run.version}'s series"
    if not tree_run.step:
        print(f"  the series' files in it match no step of {series}, so nothing is expected")
        return Exit.RACE if count else Exit.OK
    step = step_label(tree_run.step)
    differ = _differ(tree_run)
    if differ:
        print(
            f"  FAILED: the series' files in it are step {step} of {series}, whose "
            f"[races] table expects otherwise in: {', '.join(differ)}"
        )
        return Exit.RACE
    print(f"  the series' files in it are step {step} of {series}, as its [races] table expects")
    return Exit.RACE if count else Exit.OK
