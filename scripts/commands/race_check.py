"""Show, on the CPU, which FutureMap stream races each step of the series closes."""

from racecheck.cli import CODES, main

__all__ = ["CODES", "main"]
