"""Start a command of scripts/: hold SIGINT, check the Python, then import and run its module.
It and the launchers (scripts/ files without a suffix) parse on every Python, 2.7 and 3.6
included (no f-strings, annotations, `from __future__`): an old one is told what it needs."""

import signal
import sys

# Held while the command is imported (a KeyboardInterrupt inside the import machinery can
# surface as an "Exception ignored" traceback); start() releases it, raising a pending one.
if hasattr(signal, "pthread_sigmask"):  # Python 3.3 and later
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])

# for pods with only Ubuntu 22.04's python3: what check-install imports is 3.10-safe
NEEDED_BY = {"check_install": (3, 10)}


def start(module_name):
    """Run the command in commands/<module_name>.py: its main() under the one wrapper."""
    try:
        needed = NEEDED_BY.get(module_name, (3, 11))
        if sys.version_info < needed:
            sys.stderr.write(
                "error: this command needs Python %d.%d or newer; this is Python %s\n"  # noqa: UP031
                "next step: run it with a newer Python, e.g. python%d.%d %s\n"
                # no (*needed, ...): Python 2.7 cannot parse it
                % (needed + (sys.version.split()[0],) + needed + (" ".join(sys.argv),))  # noqa: RUF005
            )
            sys.exit(16)  # Exit.ENVIRONMENT in patchset/errors.py
        import importlib

        module = importlib.import_module("commands." + module_name)
        from patchset import cli

        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\n")
        sys.exit(130)  # Exit.INTERRUPTED
    cli.run(module.main)
