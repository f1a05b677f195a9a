"""check-install's own package: what an environment runs and whether its
configuration reaches the race. Standard library only; the zipapp carries
this package, the catalog and the release data, and no other command's code.
"""
