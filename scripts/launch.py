#!/usr/bin/env python3
"""Start a command of scripts/: each scripts/NAME is a link to this file, and NAME names the
module, commands/NAME.py. It holds SIGINT, checks the Python, then imports and runs the module.
It parses on every Python, 2.7 and 3.6 included (no f-strings, annotations, `from __future__`):
an old one is told what it needs."""

import sys


def _interrupted():
    sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\n")
    sys.exit(130)  # Exit.INTERRUPTED


try:  # a Ctrl-C before SIGINT is held is, as one later, one line and exit 130
    import os
    import signal

    # Held while the command is imported (a KeyboardInterrupt inside the import machinery can
    # surface as an "Exception ignored" traceback); start() releases it, raising a pending one.
    if hasattr(signal, "pthread_sigmask"):  # Python 3.3 and later
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
except KeyboardInterrupt:
    _interrupted()

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
        _interrupted()
    cli.run(module.main)


def command_of(path):
    """NAME of the link scripts/NAME that path is (a copy of it is named so too), or leads to."""
    while os.path.islink(path) and os.path.basename(os.readlink(path)) != "launch.py":
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return os.path.basename(path).replace("-", "_")


if __name__ == "__main__":
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path.insert(0, here)
    name = command_of(sys.argv[0])
    if not os.path.isfile(os.path.join(here, "commands", name + ".py")):
        sys.stderr.write(
            "error: %s is not a command of %s\n"  # noqa: UP031
            "next step: run one by its name, e.g. %s --help\n"
            % (sys.argv[0], here, os.path.join(here, "apply-patches"))
        )
        sys.exit(2)  # Exit.USAGE
    start(name)
