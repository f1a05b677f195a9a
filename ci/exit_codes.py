"""The README's exit-code table, made from the one enum and the codes each command declares.

--write rewrites it between its two markers; without, exit 13 (stale) when it differs from a
fresh one. It lives here, above every library, because it imports every command.
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "ci")]

from patchset.errors import COMMON, EXIT_TEXT, Exit  # noqa: E402

README = ROOT / "README.md"
BEGIN = "<!-- exit codes: made by `python3 ci/exit_codes.py --write` -->"
END = "<!-- end of exit codes -->"
# Every launcher in scripts/ (its module in scripts/commands/), and ci/run-gpu, read by path.
LAUNCHERS = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and not p.suffix)


def declared_codes(command: str) -> set[Exit]:
    """The codes a command says it can return (its CODES), with those every command has."""
    if command.startswith("ci/"):
        return set(runpy.run_path(str(ROOT / command), run_name="docs")["CODES"]) | set(COMMON)
    return set(importlib.import_module(f"commands.{command.replace('-', '_')}").CODES) | set(COMMON)


def exit_code_table() -> str:
    """One row per code of the enum: its meaning and the commands that can return it."""
    commands = [*LAUNCHERS, "ci/run-gpu"]
    by_code: dict[Exit, list[str]] = {code: [] for code in Exit}
    for command in commands:
        for code in declared_codes(command):
            by_code[code].append(command)
    lines = ["| code | meaning | returned by |", "|---|---|---|"]
    for code in sorted(Exit):
        who = "every command" if len(by_code[code]) == len(commands) else ", ".join(by_code[code])
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
