"""The patch-set library behind the commands in scripts/.

It knows the pin, the series, the patches and git, and nothing else:
the commands parse arguments, call in here, print and set the exit code.
"""

import sys

# Checked before anything that needs 3.11 (tomllib, hashlib.file_digest) is imported.
if sys.version_info < (3, 11):  # noqa: UP036 (this guard is for older Pythons)
    sys.stderr.write(
        "error: this command needs Python 3.11 or newer; this is Python "
        + sys.version.split()[0]
        + "\nnext step: run it as python3.11 "
        + " ".join(sys.argv)
        + "\n"
    )
    sys.exit(16)
