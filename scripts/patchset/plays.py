"""The race checker's scenarios as data: what each admits, what is in flight, which barrier
runs. No torch, so race-check's --help describes them cheaply (racecheck.scenarios plays them);
here, not in racecheck, so check-install's zipapp carries them. Stdlib only, 3.10-safe."""

from dataclasses import dataclass

EAGLE = "EAGLE"
# The scheduler's WAR barrier (Scheduler._apply_war_barrier), as each overlap loop runs it.
BARRIERS = {
    "none": "no barrier (non-CUDA devices: the barrier is off)",
    "fast": "fast path (waits on the read-done event the forward records after reading its inputs)",
    "fallback": "fallback (waits on the whole forward stream)",
}


@dataclass(frozen=True)
class Play:
    """One scenario: a forward in flight, then a prebuilt batch admitted."""

    name: str
    title: str
    spec: str | None  # EAGLE, or None for the non-speculative path
    prebuilt: tuple[int, ...]  # pool rows of the prebuilt requests admitted
    finished: tuple[int, ...]  # rows of finished requests the in-flight forward still writes
    running: tuple[int, ...] = ()  # rows it writes of requests that keep running
    consumer: bool = False  # a later consumer reads the rows back (publish only)
    barrier: str | None = None  # played inside the overlap loop with this barrier
    hisparse: bool = False  # the rows go to hisparse requests prefilled here, not to prebuilt ones

    @property
    def forward_rows(self) -> tuple[int, ...]:
        return self.finished + self.running

    @property
    def text(self) -> str:
        path = "EAGLE" if self.spec == EAGLE else "non-speculative"
        reused = sorted(set(self.prebuilt) & set(self.finished))
        admitted = "hisparse request" if self.hisparse else "prebuilt"
        parts = [
            f"{self.title} ({path})",
            f"{admitted} rows {_rows(self.prebuilt)}",
            f"in flight: finished rows {_rows(self.finished)}"
            + (f", running rows {_rows(self.running)}" if self.running else ""),
            f"rows reused: {_rows(reused) if reused else 'none'}",
        ]
        if self.barrier:
            parts.append(f"loop: barrier, seeding, launch; {BARRIERS[self.barrier]}")
        if self.hisparse:
            parts.append(
                "then its prefill forward, its result processed (staging), the "
                "transition from staging and _build_hisparse_decode_batch's stash"
            )
        return "; ".join(parts)


def _rows(rows: tuple[int, ...] | list[int]) -> str:
    return ", ".join(map(str, rows))


def _both(names: str, title: str, *shape: object, **more: object) -> list[Play]:
    """The same shape on the EAGLE path, then on the non-speculative one (names: "S4 S5")."""
    pairs = zip(names.split(), (EAGLE, None), strict=True)
    return [Play(n, title, spec, *shape, **more) for n, spec in pairs]  # type: ignore[arg-type]


# S4..S11 vary S1..S3's batch shape (prebuilt, finished, running rows); L1..L6 replay one shape
# inside the overlap loop with each barrier; H1 plays the hisparse seam (a stash outside the
# prebuilt path).
PLAYS: tuple[Play, ...] = (
    Play("S1", "row reuse", EAGLE, prebuilt=(3,), finished=(3,)),
    Play("S2", "consumer", EAGLE, prebuilt=(5,), finished=(2,), consumer=True),
    Play("S3", "row reuse", None, prebuilt=(4,), finished=(4,)),
    *_both("S4 S5", "two requests, both rows reused", (3, 5), (3, 5)),
    *_both("S6 S7", "two requests, one row reused", (3, 5), (3,), (0,)),
    *_both("S8 S9", "four requests, two rows reused", (1, 2, 4, 6), (2, 6, 7), (0,)),
    *_both("S10 S11", "three requests, no row reused", (1, 4, 5), (2, 6), (0,)),
    *_both("L1 L2", "loop, none", (3, 5), (3,), (0,), barrier="none"),
    *_both("L3 L4", "loop, fast", (3, 5), (3,), (0,), barrier="fast"),
    *_both("L5 L6", "loop, fallback", (3, 5), (3,), (0,), barrier="fallback"),
    Play("H1", "hisparse stash", None, prebuilt=(3,), finished=(3,), hisparse=True),
)
BY_NAME = {play.name: play for play in PLAYS}
SCENARIOS = tuple(BY_NAME)
