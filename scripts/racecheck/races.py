"""What a race is, as plain data: no torch needed to read or print one."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Site:
    file: str  # relative to its root's parent
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Access:
    kind: str  # "read" or "write"
    stream: str
    operator: str
    code: tuple[Site, ...]  # frames in the code under test, innermost first
    driver: tuple[Site, ...]  # frames in the scenario that drove it, innermost first


@dataclass(frozen=True)
class Race:
    """Two accesses to one row, on two streams, that nothing orders."""

    buffer: str
    row: int
    first: Access
    second: Access

    @property
    def kind(self) -> str:
        """'write/write', 'write/read' or 'read/write' (first access / second)."""
        return f"{self.first.kind}/{self.second.kind}"
