"""Races as data (for the trip between processes), table cells, and readable text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest
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
    for kind, text in _KIND_TEXT.items():
        rows_of: dict[str, set[int]] = {}
        for k, buffer, row in cell:
            if k == kind:
                rows_of.setdefault(buffer, set()).add(row)
        groups: dict[tuple[int, ...], list[str]] = {}
        for buffer in sorted(rows_of, key=_buffer_rank):
            groups.setdefault(tuple(sorted(rows_of[buffer])), []).append(buffer)
        for rows, buffers in groups.items():
            noun = "row" if len(rows) == 1 else "rows"
            parts.append(
                text.format(", ".join(buffers)) + f" in {noun} " + ", ".join(map(str, rows))
            )
    return "; ".join(parts)


def _buffer_rank(name: str) -> tuple[int, str]:
    return (RELAY_BUFFERS.index(name) if name in RELAY_BUFFERS else len(RELAY_BUFFERS), name)


def expected_table(manifest: PinManifest, scenarios: Sequence[str]) -> Table:
    """The manifest's [races] table: per scenario and step, the races left open.

    Each entry is {kind, buffers, rows}: every buffer races in every row with
    that kind. Every scenario must list every step of the series.
    """
    where = "the pin manifest's [races] table"
    table = manifest.raw.get("races")
    if not isinstance(table, dict):
        raise _bad_table(f"{where} is missing")
    expected: Table = {}
    for name in scenarios:
        row = table.get(name)
        if not isinstance(row, dict):
            raise _bad_table(f"{where} has no [races.{name}]")
        missing = [step for step in manifest.steps if step not in row]
        if missing:
            raise _bad_table(f"[races.{name}] has no entry for step {', '.join(missing)}")
        expected[name] = {}
        for step in manifest.steps:
            cell: set[tuple[str, str, int]] = set()
            try:
                for entry in row[step]:
                    kind = entry["kind"]
                    if kind not in _KIND_TEXT:
                        raise ValueError(f"kind {kind!r}")
                    cell |= {(kind, b, int(r)) for b in entry["buffers"] for r in entry["rows"]}
            except (KeyError, TypeError, ValueError) as err:
                raise _bad_table(f"[races.{name}] step {step}: a wrong entry ({err})") from None
            expected[name][step] = frozenset(cell)
    return expected


def _bad_table(problem: str) -> BackportError:
    return BackportError(
        Exit.PATCHSET_INVALID,
        problem,
        "give each scenario a [races.NAME] table with one list per step of the series, "
        "as patches/sglang-0.5.15.post1/pin.toml does",
    )


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
