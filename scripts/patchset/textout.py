"""The one text table and the one progress line that every command prints."""

import sys
import textwrap
from collections.abc import Sequence
from itertools import zip_longest


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], wrap: int = 0, markdown: bool = False
) -> str:
    """Columns padded to their widest cell, cells longer than wrap (if set) wrapped in place;
    markdown: a GitHub table (`| a | b |`), for reports meant to be rendered."""
    cells = [[textwrap.wrap(c, wrap) or [""] if wrap else [c] for c in r] for r in (header, *rows)]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(header))]
    ruled = [cells[0], [["-" * w] for w in widths], *cells[1:]]  # the header's rule below it
    lines = [
        [c.ljust(w) for c, w in zip(parts, widths, strict=True)]
        for row in ruled
        for parts in zip_longest(*row, fillvalue="")
    ]
    if markdown:
        return "\n".join("| " + " | ".join(line) + " |" for line in lines)
    return "\n".join("  ".join(line).rstrip() for line in lines)


def progress(message: str) -> None:
    """One line when a long operation starts, so nothing sits silent."""
    print(f"... {message}", file=sys.stderr, flush=True)
