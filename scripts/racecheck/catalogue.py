"""The scenarios as data, defined in patchset/plays.py (check-install's zipapp has them)."""

from patchset.plays import BARRIERS, BY_NAME, EAGLE, PLAYS, SCENARIOS, Play

__all__ = ["BARRIERS", "BY_NAME", "EAGLE", "PLAYS", "SCENARIOS", "Play"]
