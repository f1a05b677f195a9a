"""Show, on the CPU, which FutureMap stream races each step of the series closes."""

from __future__ import annotations
