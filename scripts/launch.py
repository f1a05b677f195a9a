"""Start a command of scripts/: check the Python first, then import and run its module.

Every file in scripts/ without a .py suffix is a few lines that call start().
The command itself lives in scripts/commands/ and uses syntax that no Python
before 3.11 (3.10 for check-install, which runs in pods that have only an
Ubuntu 22.04 python3) can even parse, so the version check must run before
it is imported; and a Ctrl-C while the imports run (torch-free, but not instant)
must end as one line and exit 130, like a Ctrl-C later on: the launcher holds
SIGINT until the imports are done, and a Ctrl-C that came meanwhile is taken then.

This file and the launchers are written in syntax that every Python reads,
2.7 and 3.6 included: no f-strings, no annotations, no `from __future__`.
"""

import sys

NEEDED = (3, 11)
# check-install (and its zipapp) runs on Python 3.10 too: what it imports is
# 3.10-safe and reads TOML through patchset/tomlread.py
NEEDED_BY = {"check_install": (3, 10)}
EXIT_ENVIRONMENT = 16  # Exit.ENVIRONMENT in patchset/errors.py
EXIT_INTERRUPTED = 130  # Exit.INTERRUPTED


def interrupted():
    sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\n")
    sys.exit(EXIT_INTERRUPTED)


def start(module_name):
    """Run the command in commands/<module_name>.py: its main() under the one wrapper."""
    try:
        needed = NEEDED_BY.get(module_name, NEEDED)
        if sys.version_info < needed:
            # No f-string: this must parse on Python 2.7 and 3.6.
            sys.stderr.write(
                "error: this command needs Python %d.%d or newer; this is Python %s\n"  # noqa: UP031
                "next step: run it with a newer Python, e.g. python%d.%d %s\n"
                # no (*needed, ...): Python 2.7 cannot parse it
                % (needed + (sys.version.split()[0],) + needed + (" ".join(sys.argv),))  # noqa: RUF005
            )
            sys.exit(EXIT_ENVIRONMENT)
        import importlib
        import signal

        # SIGINT is held (the launcher blocked it) while the modules import: a
        # KeyboardInterrupt raised inside the import machinery can surface as an
        # "Exception ignored" traceback. Released here, a pending one is raised now.
        module = importlib.import_module("commands." + module_name)
        from patchset import cli

        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    except KeyboardInterrupt:
        interrupted()
    cli.run(module.main)
