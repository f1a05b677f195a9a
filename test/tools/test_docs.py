"""The docs cannot drift from the tree: every relative link resolves, and every
command-line flag the docs give one of our commands is in that command's usage."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

from conftest import SCRIPTS

ROOT = SCRIPTS.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Our commands as the docs name them; ci/run-gpu has subcommands of its own.
OURS = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and not p.suffix)
RUN_GPU_SUBCOMMANDS = ("wheelhouse", "step-files", "image-double")
# Other programs whose flags the docs quote; a flag after one of them is not ours.
FOREIGN = (
    "git", "pip", "uv", "pytest", "python", "python3", "kubectl", "docker", "curl", "ruff",
    "actionlint", "zizmor", "ssh", "tar", "sha256sum", "torch", "gh", "pyenv", "env",
)  # fmt: skip
WORD = re.compile(r"(?:scripts/|ci/)?[A-Za-z][\w.-]*|--[a-z][a-z0-9-]*")
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def relative_links(text: str) -> list[str]:
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        found.append(target.split("#", 1)[0])
    return found


def test_every_relative_link_resolves():
    broken = [
        f"{doc.relative_to(ROOT)}: {target}"
        for doc in DOCS
        for target in relative_links(doc.read_text(encoding="utf-8"))
        if not (doc.parent / target).exists()
    ]
    assert not broken, broken


def test_the_link_check_finds_a_broken_link():
    assert relative_links("see [x](docs/nope.md#a) and [y](https://e.org/a.md)") == ["docs/nope.md"]


@functools.cache
def usage_flags(command: str) -> frozenset[str]:
    """The options in a command's usage lines (not its prose), as argparse prints them."""
    where = ROOT / command if "/" in command else SCRIPTS / command
    argv = [sys.executable, str(where)]
    if command.startswith("ci/run-gpu "):
        argv = [sys.executable, str(ROOT / "ci" / "run-gpu"), command.split()[1]]
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=True).stdout
    usage = out.split("\n\n", 1)[0]
    return frozenset({"--help", *FLAG.findall(usage)})


def named_flags(text: str) -> list[tuple[str, str]]:
    """(command, flag) for each flag that follows one of our commands in a paragraph
    or a code block line, until another program is named."""
    pairs = []
    for block in re.split(r"\n\s*\n|```", text):
        lines = block.strip("\n").split("\n")
        # a table row or a command per line stands alone; a paragraph is one run of words
        alone = any(line.startswith(("|", "  ", "$ ")) for line in lines)
        for chunk in lines if alone or block.lstrip().startswith("|") else [block]:
            current: str | None = None
            # a quoted --launch-args value holds sglang's flags, not ours
            chunk = re.sub(r'--launch-args[ =]"[^"]*"', "--launch-args", chunk)
            for word in WORD.findall(chunk):
                name = word.removeprefix("scripts/").removesuffix(".pyz")
                if word.startswith("--"):
                    if current:
                        pairs.append((current, word))
                elif name in OURS or name == "ci/run-gpu":
                    current = name
                elif current == "ci/run-gpu" and name in RUN_GPU_SUBCOMMANDS:
                    current = f"ci/run-gpu {name}"
                elif name in FOREIGN:
                    current = None
    return pairs


def test_every_flag_the_docs_name_is_in_its_commands_usage():
    unknown = sorted(
        {
            f"{doc.relative_to(ROOT)}: {command} {flag}"
            for doc in DOCS
            for command, flag in named_flags(doc.read_text(encoding="utf-8"))
            if flag not in usage_flags(command)
        }
    )
    assert not unknown, unknown


def test_the_flag_check_finds_a_flag_a_command_lacks():
    pairs = named_flags(
        "run `scripts/apply-patches --no-such-flag`, then `git am --3way`, and\n"
        'check-install --launch-args "--disaggregation-mode decode"'
    )
    assert pairs == [("apply-patches", "--no-such-flag"), ("check-install", "--launch-args")]
    assert "--no-such-flag" not in usage_flags("apply-patches")


# A place in our own code as race-check prints it: "racecheck/scenarios.py:85 in inflight_forward".
PLACE = re.compile(r"\b((?:scripts/)?(?:[a-z_]+/)+[a-z_]+\.py):(\d+) in (\w+)")


def misplaced(text: str) -> list[str]:
    """The quoted places of ours whose line is not inside the function named."""
    wrong = []
    for path, line, function in PLACE.findall(text):
        source = next(
            (p for p in (ROOT / path, SCRIPTS / path, ROOT / "ci" / path) if p.is_file()), None
        )
        if source is None:  # sglang's own files: the release's, not ours
            continue
        functions = [
            n
            for n in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
        ]
        if not any(n.lineno <= int(line) <= (n.end_lineno or 0) for n in functions):
            wrong.append(f"{path}:{line} in {function}")
    return wrong


def test_every_place_in_our_code_the_docs_quote_is_in_its_function():
    wrong = [f"{doc.relative_to(ROOT)}: {p}" for doc in DOCS for p in misplaced(doc.read_text())]
    assert not wrong, f"{wrong}: run the command the doc quotes again and copy its lines"


def test_the_place_check_finds_a_line_outside_its_function():
    assert misplaced("driven by racecheck/scenarios.py:1 in play_hisparse") == [
        "racecheck/scenarios.py:1 in play_hisparse"
    ]


def test_every_doc_is_checked():
    assert {doc.name for doc in DOCS} >= {"README.md", "apply.md", "check-install.md"}
    assert Path(ROOT / "docs").is_dir()
