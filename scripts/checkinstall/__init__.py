"""check-install's own package: standard library only, Python 3.10 and later."""
