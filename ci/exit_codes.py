"""The README's exit-code table, made from the one enum and the codes each command declares.

`python3 ci/exit_codes.py --write` rewrites the table in README.md between its
two markers; without --write it exits 13 (stale) when the README's table
differs from a fresh one (test/tools/test_readme.py runs that check). It
lives here, above every library, because it imports every command.
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "ci")]

from patchset.errors import COMMON, EXIT_TEXT, Exit  # noqa: E402
from patchset.paths import PROJECT_ROOT  # noqa: E402

README = PROJECT_ROOT / "README.md"
BEGIN = "<!-- exit codes: made by `python3 ci/exit_codes.py --write` -->"
END = "<!-- end of exit codes -->"
# The commands: every launcher in scripts/ (its module in scripts/commands/),
# and the GPU pipeline's script, read by path.
LAUNCHERS = sorted(
    p.name for p in (PROJECT_ROOT / "scripts").iterdir() if p.is_file() and not p.suffix
)
COMMANDS = {name: f"commands.{name.replace('-', '_')}" for name in LAUNCHERS} | {
    "ci/run-gpu": "ci/run-gpu"
}


def declared_codes(where: str) -> set[Exit]:
    """The codes a command says it can return (its CODES), with those every command has."""
    if "/" in where:
        codes: Iterable[Exit] = runpy.run_path(str(PROJECT_ROOT / where), run_name="docs")["CODES"]
    else:
        codes = importlib.import_module(where).CODES
    return set(codes) | set(COMMON)


def exit_code_table() -> str:
    """One row per code of the enum: its meaning and the commands that can return it."""
    by_code: dict[Exit, list[str]] = {code: [] for code in Exit}
    for command, where in COMMANDS.items():
        for code in declared_codes(where):
            by_code[code].append(command)
    lines = ["| code | meaning | returned by |", "|---|---|---|"]
    for code in sorted(Exit):
        commands = by_code[code]
        who = "every command" if len(commands) == len(COMMANDS) else ", ".join(commands)
        lines.append(f"| {int(code)} | {EXIT_TEXT[code]} | {who or 'none'} |")
    return "\n".join(lines) + "\n"


def with_table(readme: str) -> str:
    """The README's text with a fresh table between the markers."""
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"error: {README} lacks the exit-code markers\n{BEGIN}\n{END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{exit_code_table()}{END}{tail}"


def main() -> int:
    p = argparse.ArgumentParser(prog="ci/exit_codes.py", description=__doc__)
    p.add_argument("--write", action="store_true", help="rewrite README.md's table in place")
    args = p.parse_args()
    text = README.read_text(encoding="utf-8")
    fresh = with_table(text)
    if args.write:
        README.write_text(fresh, encoding="utf-8")
        return Exit.OK
    if fresh != text:
        print(f"stale: {README}'s exit-code table; run with --write", file=sys.stderr)
        return Exit.STALE
    print(f"up to date: {README}'s exit-code table")
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
