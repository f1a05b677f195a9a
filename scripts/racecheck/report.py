"""Races as data (for the trip between processes), table cells, and readable text."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .races import Access, Race, Site

STEPS = ("base", "0001", "0002")
SCENARIOS = ("S1", "S2", "S3")
CLEAN = "clean"
SCENARIO_TEXT = {
    "S1": "row reuse (EAGLE): an in-flight forward publishes and stashes row r; "
    "a prebuilt request seeds the same row r on the schedule stream",
    "S2": "consumer (EAGLE): the forward publishes row r1, a prebuilt request seeds "
    "row r2, a consumer stream waits on publish_ready and reads both rows",
    "S3": "non-speculative prebuilt: the forward publishes and stashes row r; the "
    "prebuilt path stashes its last token into row r on the schedule stream",
}

# A cell is the set of (kind, buffer) pairs of the races a scenario shows on a
# step, kind being the first access and the second ("write/write", ...).
Cell = frozenset[tuple[str, str]]

_S1_BUFFERS = (
    "new_seq_lens_buf",
    "output_tokens_buf",
    "topk_p_buf",
    "topk_index_buf",
    "hidden_states_buf",
)
_S1_RACES: Cell = frozenset(("write/write", b) for b in _S1_BUFFERS)
_S2_RACES: Cell = frozenset({("write/read", "new_seq_lens_buf")})
_S3_RACES: Cell = frozenset({("write/write", "output_tokens_buf")})
_NONE: Cell = frozenset()

# The table of issue 4: which races each step of the series leaves open.
EXPECTED: dict[str, dict[str, Cell]] = {
    "S1": {"base": _S1_RACES, "0001": _S1_RACES, "0002": _NONE},
    "S2": {"base": _S2_RACES, "0001": _NONE, "0002": _NONE},
    "S3": {"base": _S3_RACES, "0001": _S3_RACES, "0002": _NONE},
}

_BUFFER_ORDER = (*_S1_BUFFERS, "draft_probs_buf", "dsa_topk_indices_buf")
_KIND_TEXT = {
    "write/write": "unordered writes to {}",
    "write/read": "unordered read of {} (after another stream's write)",
    "read/write": "write over an unordered read of {}",
}


def cell_of(races: Iterable[Race]) -> Cell:
    return frozenset((race.kind, race.buffer) for race in races)


def describe(cell: Cell) -> str:
    if not cell:
        return CLEAN
    parts = []
    for kind, text in _KIND_TEXT.items():
        buffers = sorted((b for k, b in cell if k == kind), key=_buffer_rank)
        if buffers:
            parts.append(text.format(", ".join(buffers)))
    return "; ".join(parts)


def _buffer_rank(name: str) -> tuple[int, str]:
    return (_BUFFER_ORDER.index(name) if name in _BUFFER_ORDER else len(_BUFFER_ORDER), name)


def step_label(step: str) -> str:
    return step if step == "base" else f"+{step}"


def grid(columns: Sequence[str], cells: Mapping[str, Mapping[str, str]], width: int = 36) -> str:
    """A text table: one row per scenario, one column per entry of columns, cells wrapped."""
    header = ["scenario", *columns]
    rows = [[name, *(cells[name].get(col, "-") for col in columns)] for name in cells]
    wrapped = [[textwrap.wrap(cell, width) or [""] for cell in row] for row in rows]
    widths = [len(h) for h in header]
    for row in wrapped:
        for i, lines in enumerate(row):
            widths[i] = max(widths[i], *(len(line) for line in lines))
    out = [_line(header, widths), _line(["-" * w for w in widths], widths)]
    for row in wrapped:
        for n in range(max(len(lines) for lines in row)):
            out.append(_line([lines[n] if n < len(lines) else "" for lines in row], widths))
    return "\n".join(out)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


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
