"""Show, on the CPU, which FutureMap stream races each step of the series closes."""

from racecheck.cli import main

__all__ = ["main"]
