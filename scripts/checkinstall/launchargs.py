"""A deployment's launch command read as sglang reads it, and the table parser.

An operator's copied command line (a chart's args, a unit's ExecStart, a shell line)
becomes sglang's words, the server's environment and a readable --config path. Where
ServerArgs cannot be imported, parse_with_table reads the release's [launch] table by
argparse's rules. What sglang would refuse is refused here (exit 28); what the table
cannot settle is named, and never yields "not exposed".
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.manifest import LAUNCH_FLAGS, LaunchSettings

FIELDS = (*LAUNCH_FLAGS, "disable_decode_cuda_graph")
# ServerArgs.add_cli_args: --disaggregation-mode's choices in every served release
DISAGGREGATION_MODES = ("null", "prefill", "decode")
# Options the table parser knows beyond the table: every release has them, and
# they take one value that does not bear on the race.
NEUTRAL = ("--model-path", "--model")
CONFIG = "--config"
# sglang's EnvBool (srt/environ.py): these, in any case; anything else is
# invalid, and sglang warns and takes the variable's default.
ENV_TRUE = ("true", "1", "yes", "y")
ENV_FALSE = ("false", "0", "no", "n")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(?:.*/)?python[0-9.]*$")
_SGLANG = re.compile(r"^(?:.*/)?sglang$")
# a shell line's pieces: '...', "..." (with its escapes), an escape, or plain text
_SHELL_PIECE = re.compile(r"""'[^']*'?|"(?:\\[\s\S]|[^"\\])*"?|\\(?:\r\n|[\s\S])?|[^'"\\]+""")
_ESCAPE = re.compile(r"\\(\r\n|\n|[\s\S])")
_YAML_TIMEOUT_S = 60
MAX_CONFIG_BYTES = 1 << 20
_YAML_ALIAS = re.compile(r"(?:^|[\s\[{,:?-])[&*][^\s\]},]", re.M)
# Reads a YAML file as sglang's ConfigArgumentMerger does (yaml.safe_load), in
# the interpreter that has PyYAML; prints JSON.
_YAML_PROGRAM = r"""
import json, sys
try:
    import yaml
except BaseException as err:
    print(json.dumps({"no_yaml": type(err).__name__ + ": " + str(err)}))
    sys.exit(0)
try:
    with open(sys.argv[1], encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    print(json.dumps({"data": data}, default=str))
except BaseException as err:
    print(json.dumps({"error": (type(err).__name__ + ": " + str(err)).splitlines()[0][:300]}))
"""


@dataclass
class Settings:
    """The launch settings that decide whether a deployment reaches the race."""

    values: dict[str, Any]  # ServerArgs field -> value
    parser: str  # which parser gave them, in words
    eagle: bool  # the speculative algorithm seeds the EAGLE draft state
    env: dict[str, str] = field(default_factory=dict)  # the server's environment
    turned_off_by: list[str] = field(default_factory=list)  # sglang's handlers that did
    not_evaluated: list[str] = field(default_factory=list)  # "handler (why)"
    # what the parser could not settle: with any of it, never "not exposed"
    unsettled: list[str] = field(default_factory=list)
    adjusted: bool = False  # the values are after sglang's own adjustments
    # the server's torch build: "cuda", "rocm" (HIP: its GPU is "cuda" too, but is_cuda()
    # is false), or None (not known: taken as CUDA)
    torch_build: str | None = None
    torch_source: str = "the torch build not known here: taken as CUDA (--torch-build)"

    def get(self, name: str) -> Any:
        return self.values.get(name)


@dataclass
class Launch:
    args: list[str]  # the options, as sglang's parser gets them
    env: dict[str, str]  # NAME=VALUE words before the command
    command: str  # the command that takes them, in words


def not_understood(what: str, next_step: str = "") -> BackportError:
    return BackportError(
        Exit.EXPOSURE_UNKNOWN,
        f"configuration not understood: {what}; exposure unknown (never taken as safe)",
        next_step
        or "pass the options as the running server has them (its chart's args, its unit's "
        "ExecStart), or ask the server itself with --server-info URL",
    )


def refused(release: str, why: str) -> BackportError:
    return not_understood(
        f"sglang {release} refuses these launch arguments ({why}): a server does not start "
        "with them, so they are not what the deployment runs"
    )


def _join_continuations(text: str) -> str:
    """text with the shell's backslash-newline continuations removed (outside '...')."""

    def unescape(escape: re.Match[str]) -> str:
        return "" if escape[1] in ("\n", "\r\n") else escape[0]

    return "".join(
        piece if piece.startswith("'") else _ESCAPE.sub(unescape, piece)
        for piece in _SHELL_PIECE.findall(text)
    )


def read_launch_args(text: str) -> Launch:
    """The launch command as a shell would run it: an environment prefix, then
    `python -m sglang.launch_server`, `sglang serve` or the options alone."""
    try:
        words = shlex.split(_join_continuations(text))
    except ValueError as err:
        raise BackportError(
            Exit.USAGE,
            f"--launch-args cannot be split as a shell would: {err}",
            "quote it as the chart or unit does, e.g. --launch-args '--model-path M ...'",
        ) from None
    at = 1 if words[:1] == ["exec"] else 0
    at += 1 if words[at : at + 1] == ["env"] else 0
    prefix = at
    while at < len(words) and _ENV_WORD.match(words[at]):
        at += 1
    env = parse_env(words[prefix:at])
    command, args = "the options alone", words[at:]
    if at < len(words) and _PYTHON.match(words[at]):
        python = at
        at += 1
        while at < len(words) and words[at].startswith("-") and words[at] != "-m":
            at += 2 if words[at] in ("-X", "-W") else 1
        if words[at : at + 2] != ["-m", "sglang.launch_server"]:
            raise not_understood(
                f"--launch-args start {shlex.join(words[python : at + 2])!r}, not "
                "python -m sglang.launch_server"
            )
        command, args = "python -m sglang.launch_server", words[at + 2 :]
    elif at < len(words) and _SGLANG.match(words[at]) and words[at + 1 : at + 2] == ["serve"]:
        command, args = "sglang serve", _model_type(words[at + 2 :])
    elif at < len(words) and not words[at].startswith("-"):
        raise not_understood(
            f"--launch-args start with {words[at]!r}: neither an option nor sglang serve or "
            "python -m sglang.launch_server",
        )
    return Launch(args, env, command)


def _model_type(args: list[str]) -> list[str]:
    """args without sglang serve's own --model-type (the CLI takes it out before
    prepare_server_args); a diffusion server is not the one judged here."""
    kept, kind, at = [], "auto", 0
    while at < len(args):
        if args[at] == "--model-type" and at + 1 < len(args):
            kind, at = args[at + 1], at + 2
        elif args[at].startswith("--model-type="):
            kind, at = args[at].partition("=")[2], at + 1
        else:
            kept.append(args[at])
            at += 1
    if kind not in ("auto", "llm"):
        raise not_understood(
            f"sglang serve --model-type {kind}: not the language-model server this check judges"
        )
    return kept


def place_config(args: list[str], config: Path | None, root: Path | None) -> list[str]:
    """args with the --config file's path as this machine reads it: --config FILE (a copy
    of the server's file) replaces the one named or is added; a relative path is taken
    from --config-root (the server's working folder)."""
    args = list(args)
    at = config_at(args)
    if config is not None:
        if not config.is_file():
            raise not_understood(f"--config {config}: no such file here")
        path = config
    elif at is None:
        return args
    else:
        path = Path(args[at + 1])
        if not path.is_absolute():
            if root is None:
                raise not_understood(
                    f"--config {path} is relative to the server's working folder",
                    "pass --config-root DIR (the folder the server starts in, as copied "
                    "here) or --config FILE (a copy of the server's file)",
                )
            path = root / path
        if not path.is_file():
            raise not_understood(
                f"--config {args[at + 1]}: {path} is not a file here",
                "pass --config FILE with a copy of the server's file, or --config-root DIR",
            )
    _check_config(path)
    if at is None:
        return [*args, CONFIG, str(path)]
    args[at + 1] = str(path)
    return args


def _check_config(path: Path) -> None:
    """A config file small and plain enough to read: YAML anchors and aliases can expand
    a small file into more than memory holds (whoever reads it, sglang too)."""
    try:
        size = path.stat().st_size
        text = path.read_bytes()[:MAX_CONFIG_BYTES].decode("utf-8", "replace")
    except OSError as err:
        raise not_understood(f"--config {path} cannot be read here: {err}") from None
    if size > MAX_CONFIG_BYTES:
        raise not_understood(f"--config {path} is {size} bytes, more than a launch config")
    if _YAML_ALIAS.search(text):
        raise not_understood(
            f"--config {path} holds YAML anchors or aliases (&name, *name), not expanded here",
            "write the values out in a copy of the file, and pass it with --config FILE",
        )


def config_at(args: list[str]) -> int | None:
    """Where the two words `--config PATH` are: sglang's prepare_server_args merges the
    file only for the word --config itself, once, with a path after it."""
    at = [n for n, word in enumerate(args) if word == CONFIG]
    if len(at) > 1:
        raise not_understood("--config is given more than once (sglang refuses that)")
    if at and at[0] + 1 == len(args):
        raise not_understood("--config names no file (sglang refuses that)")
    return at[0] if at else None


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BackportError(
                Exit.USAGE, f"--env {pair!r} is not NAME=VALUE", "pass e.g. --env FOO=1"
            )
        env[name] = value
    return env


def eagle_family(value: object, table: LaunchSettings) -> bool:
    return isinstance(value, str) and value.upper() in table.eagle_family


def env_bool(value: str) -> bool | None:
    """The value as sglang's EnvBool reads it; None where it is invalid there."""
    if value.lower() in ENV_TRUE:
        return True
    if value.lower() in ENV_FALSE:
        return False
    return None


def read_yaml(path: str, python: Path) -> dict[str, Any]:
    """A --config file as sglang reads it (yaml.safe_load), with python's PyYAML."""
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise not_understood(f"--config {path} is not a .yaml or .yml file (sglang refuses it)")
    try:
        result = subprocess.run(
            [str(python), "-c", _YAML_PROGRAM, path],
            capture_output=True,
            text=True,
            timeout=_YAML_TIMEOUT_S,
        )
        answer = json.loads((result.stdout.strip().splitlines() or ["null"])[-1])
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        raise not_understood(f"--config {path} could not be read with {python}: {err}") from None
    if not isinstance(answer, dict) or "no_yaml" in answer:
        raise not_understood(
            f"--config {path}: {python} has no PyYAML to read it as sglang does",
            "run check-install with --python of an interpreter that has PyYAML (the server's "
            "own has it), or pass the file's settings in --launch-args",
        )
    if "error" in answer:
        raise not_understood(f"--config {path} is not YAML sglang reads: {answer['error']}")
    data = answer["data"] if answer["data"] is not None else {}
    if not isinstance(data, dict):
        raise not_understood(f"--config {path} holds no mapping at its top (sglang refuses it)")
    return data


def merge_config(args: list[str], table: LaunchSettings, python: Path) -> list[str]:
    """args with the --config file's settings first, as sglang's ConfigArgumentMerger
    puts them (so the command line's own win)."""
    at = config_at(args)
    if at is None:
        return args
    store_true = {f.field for f in table.flags.values() if isinstance(f.default, bool)}
    merged: list[str] = []
    for key, value in read_yaml(args[at + 1], python).items():
        option = f"--{key}"
        if isinstance(value, bool):
            if str(key).replace("-", "_") in store_true:
                merged += [option] if value else []
            else:
                merged += [option, str(value).lower()]
        elif isinstance(value, list):
            merged += [option, *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            merged += [option, json.dumps(value)]
        else:
            merged += [option, str(value)]
    return merged + args[:at] + args[at + 2 :]


def parse_with_table(
    args: list[str], table: LaunchSettings, why: str, python: Path | None = None
) -> Settings:
    """The settings that matter, read with the release's [launch] table by argparse's
    rules; a --config file merged first (read with python's PyYAML)."""
    args = merge_config(args, table, python or Path(sys.executable))
    flags = {flag.flag: flag for flag in table.flags.values()}
    known = [*flags, *NEUTRAL]
    values: dict[str, Any] = {name: None for name in FIELDS}
    values.update({name: flag.default for name, flag in table.flags.items()})
    mode = table.flags["disaggregation_mode"].flag
    unknown: list[str] = []
    unsettled: list[str] = []
    at, after_unknown = 0, False
    while at < len(args):
        word = args[at]
        at += 1
        if word == "--" or not word.startswith("-") or word == "-":
            if after_unknown:
                continue  # a value of an option the table does not know
            raise refused(table.release, f"{word!r} is not an option, and it takes none")
        name, eq, value = word.partition("=")
        matches = [name] if name in known else [o for o in known if o.startswith(name)]
        after_unknown = not name.startswith("--") or not matches
        if after_unknown:
            unknown.append(word)
            continue
        if len(matches) > 1:
            raise refused(table.release, f"{name} is ambiguous: {', '.join(matches)}")
        option = matches[0]
        if option != name:
            unsettled.append(
                f"{name} read as {option} (argparse takes a unique start of an option; "
                "the table does not hold every option of the release to tell)"
            )
        flag = flags.get(option)
        if flag is not None and isinstance(flag.default, bool):
            if eq:
                raise refused(table.release, f"{option} takes no value ({word!r})")
            values[flag.field] = True
            continue
        if not eq:
            if at == len(args) or (args[at].startswith("-") and args[at] != "-"):
                raise refused(table.release, f"{option} expects one value")
            value = args[at]
            at += 1
        if option == mode and value not in DISAGGREGATION_MODES:
            raise refused(
                table.release,
                f"{option}: invalid choice {value!r} (choose from "
                f"{', '.join(DISAGGREGATION_MODES)})",
            )
        if flag is not None:
            values[flag.field] = value
    if unknown:
        unsettled.append(
            "options the table does not read (sglang's own parser would take or refuse "
            f"them): {' '.join(unknown)}"
        )
    algorithm = values.get("speculative_algorithm")
    eagle = eagle_family(algorithm, table)
    if algorithm is not None and not eagle:
        unsettled.append(
            f"--speculative-algorithm {algorithm}: not in the table's EAGLE family; whether "
            "it seeds the EAGLE draft state only sglang's SpeculativeAlgorithm knows"
        )
    return Settings(
        values,
        f"the launch profile [launch.{table.profile}] that sglang {table.release} names in "
        f"releases.toml ({why}); sglang's own adjustments were not evaluated",
        eagle,
        unsettled=unsettled,
    )
