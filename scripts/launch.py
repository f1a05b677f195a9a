"""Start a command of scripts/: check the Python first, then import and run its module.

Every file in scripts/ without a .py suffix calls start(). The commands, in
scripts/commands/, use syntax no Python before 3.11 (3.10 for check-install,
which runs in pods with only Ubuntu 22.04's python3) can parse, so the version
is checked before they are imported. The launcher holds SIGINT while the imports
run, so that a Ctrl-C then ends as one line and exit 130, like one later on.

This file and the launchers parse on every Python, 2.7 and 3.6 included: no
f-strings, no annotations, no `from __future__`.
"""

import sys

NEEDED = (3, 11)
# check-install (and its zipapp) runs on Python 3.10 too: what it imports is
# 3.10-safe and reads TOML through patchset/tomlread.py
NEEDED_BY = {"check_install": (3, 10)}
EXIT_ENVIRONMENT = 16  # Exit.ENVIRONMENT in patchset/errors.py
EXIT_INTERRUPTED = 130  # Exit.INTERRUPTED


def start(module_name):
    """Run the command in commands/<module_name>.py: its main() under the one wrapper."""
    try:
        needed = NEEDED_BY.get(module_name, NEEDED)
        if sys.version_info < needed:
            sys.stderr.write(
                "error: this command needs Python %d.%d or newer; this is Python %s\n"  # noqa: UP031
                "next step: run it with a newer Python, e.g. python%d.%d %s\n"
                # no (*needed, ...): Python 2.7 cannot parse it
                % (needed + (sys.version.split()[0],) + needed + (" ".join(sys.argv),))  # noqa: RUF005
            )
            sys.exit(EXIT_ENVIRONMENT)
        import importlib
        import signal

        # A KeyboardInterrupt inside the import machinery can surface as an
        # "Exception ignored" traceback; released here, a pending one is raised now.
        module = importlib.import_module("commands." + module_name)
        from patchset import cli

        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\n")
        sys.exit(EXIT_INTERRUPTED)
    cli.run(module.main)
