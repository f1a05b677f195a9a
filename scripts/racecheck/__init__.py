"""A CPU happens-before checker for sglang's FutureMap relay buffers (see cli.py)."""
