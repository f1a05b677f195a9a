"""The scenarios as data: defined in patchset/plays.py, where check-install's
zipapp carries them too; racecheck and its tests take them from here."""

from patchset.plays import BARRIERS, BY_NAME, EAGLE, PLAYS, SCENARIOS, Play

__all__ = ["BARRIERS", "BY_NAME", "EAGLE", "PLAYS", "SCENARIOS", "Play"]
