"""Shared by both suites: the outcome recorder that scripts/run-tests reads."""

pytest_plugins = ["testrun.outcomes"]
