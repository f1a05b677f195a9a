"""Races as data (for the trip between processes), table cells, and readable text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import RACE_KINDS, PinManifest, RaceEntry
from patchset.textout import table

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
