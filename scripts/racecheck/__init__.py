"""A CPU happens-before checker for the FutureMap relay buffers (commands/race_check.py)."""
