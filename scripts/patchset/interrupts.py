"""The signals that end a run; apart from lock.py, which check-install's zipapp lacks."""

from __future__ import annotations

import signal

INTERRUPTS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def hold_interrupts() -> None:
    """A run at its end: a later signal stays pending, so it exits as what it did says."""
    signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)


def release_interrupts() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)
