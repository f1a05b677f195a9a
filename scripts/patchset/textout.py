"""The one text table and the one progress line that every command prints."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from itertools import zip_longest


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], wrap: int = 0, markdown: bool = False
) -> str:
    """Columns padded to their widest cell, cells longer than wrap (if set) wrapped in place;
    markdown: a GitHub table (`| a | b |`), for reports meant to be rendered."""
    all_rows = [header, *rows]
    cells = [[textwrap.wrap(c, wrap) or [""] if wrap else [c] for c in row] for row in all_rows]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(header))]
    out: list[str] = []
    for index, row in enumerate(cells):
        out += [_line(parts, widths, markdown) for parts in zip_longest(*row, fillvalue="")]
        if index == 0:
            out.append(_line(["-" * w for w in widths], widths, markdown))
    return "\n".join(out)


def _line(cells: Sequence[str], widths: Sequence[int], markdown: bool) -> str:
    padded = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
    if markdown:
        return "| " + " | ".join(padded) + " |"
    return "  ".join(padded).rstrip()


def progress(message: str) -> None:
    """One line when a long operation starts, so nothing sits silent."""
    print(f"... {message}", file=sys.stderr, flush=True)
