"""The patch-set library behind the commands in scripts/: it knows the pin, the series, the
patches and git, and nothing else; the commands parse arguments, call in here, print and set
the exit code (scripts/launch.py checks the Python version before any of this is imported)."""
