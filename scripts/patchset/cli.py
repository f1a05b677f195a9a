"""What every command shares: argument parsing helpers and error reporting."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from .errors import EXIT_HELP, Exit, PatchSetError
from .manifest import Series
from .paths import DEFAULT_BASE, DEFAULT_PATCH_DIR


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=EXIT_HELP.format(version=DEFAULT_BASE),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_patch_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--patch-set",
        type=Path,
        default=DEFAULT_PATCH_DIR,
        metavar="DIR",
        help=f"patch set folder (default: patches/sglang-{DEFAULT_BASE})",
    )


def load_series(folder: Path) -> Series:
    return Series.load(folder)


def run(main: Callable[[], int]) -> None:
    """Call main; turn refusals into their message and exit code."""
    try:
        code = main()
    except PatchSetError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except Exception:
        traceback.print_exc()
        print(
            "error: internal error (the trace above); nothing of yours was reset",
            file=sys.stderr,
        )
        code = Exit.INTERNAL
    sys.exit(int(code))
