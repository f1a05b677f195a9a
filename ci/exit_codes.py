"""The README's exit-code table, made from the one enum and the codes each command declares:
--write rewrites it between its two markers; without, exit 13 (stale) when it differs from a
fresh one. It lives here, above every library, because it imports every command."""

import argparse
import runpy
import sys
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "ci")]

from patchset.errors import COMMON, EXIT_TEXT, Exit  # noqa: E402

README = ROOT / "README.md"
BEGIN = "<!-- exit codes: made by `python3 ci/exit_codes.py --write` -->"
END = "<!-- end of exit codes -->"
# Every command of scripts/: a link to launch.py, its module in scripts/commands/.
LAUNCHERS = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and not p.suffix)


def exit_code_table() -> str:
    """One row per code of the enum: its meaning and the commands that can return it."""
    declared = {c: import_module(f"commands.{c.replace('-', '_')}").CODES for c in LAUNCHERS}
    declared["ci/run-gpu"] = runpy.run_path(str(ROOT / "ci" / "run-gpu"), run_name="docs")["CODES"]
    lines = ["| code | meaning | returned by |", "|---|---|---|"]
    for code in sorted(Exit):
        who = [c for c, codes in declared.items() if code in codes or code in COMMON]
        said = "every command" if len(who) == len(declared) else ", ".join(who) or "none"
        lines.append(f"| {int(code)} | {EXIT_TEXT[code]} | {said} |")
    return "\n".join(lines) + "\n"


def with_table(readme: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"error: {README} lacks the exit-code markers\n{BEGIN}\n{END}")
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{exit_code_table()}{END}{rest.split(END, 1)[1]}"


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
