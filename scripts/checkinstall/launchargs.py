"""A launch command read as sglang reads it, else by the release's [launch] table where
ServerArgs cannot run: what sglang refuses is refused (exit 28), what the table cannot, named."""

import itertools
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit
from patchset.releases import LAUNCH_FLAGS, LAUNCH_OPTIONAL, LaunchSettings

KINDS = {**LAUNCH_FLAGS, **LAUNCH_OPTIONAL}  # ServerArgs field -> bool (a switch) or str
FIELDS = tuple(KINDS)
DISAGGREGATION_MODES = ("null", "prefill", "decode")  # add_cli_args' choices in every release
NEUTRAL = ("--model-path", "--model")  # in every release; their value does not bear on the race
# sglang's EnvBool (srt/environ.py), in any case; else sglang warns and takes the default
ENV_BOOL = dict.fromkeys(("true", "1", "yes", "y"), True)
ENV_BOOL |= dict.fromkeys(("false", "0", "no", "n"), False)
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# a shell line's pieces: '...', "..." (with its escapes), an escape, or plain text
_SHELL_PIECE = re.compile(r"""'[^']*'?|"(?:\\[\s\S]|[^"\\])*"?|\\(?:\r\n|[\s\S])?|[^'"\\]+""")
_ESCAPE = re.compile(r"\\\r?\n|(\\[\s\S])")  # a continuation, or an escape kept
MAX_CONFIG_BYTES = 1 << 20
_AS_RUN = (
    "pass the options as the running server has them (its chart's args, its unit's ExecStart), "
    "or ask the server itself with --server-info URL"
)
_YAML_ALIAS = re.compile(r"(?:^|[\s\[{,:?-])[&*][^\s\]},]", re.M)
# yaml.safe_load, as sglang's ConfigArgumentMerger reads the file, in an interpreter with PyYAML
_YAML_PROGRAM = r"""
import json, sys
key = "no_yaml"
try:
    import yaml
    key = "error"
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(json.dumps({"data": yaml.safe_load(handle)}, default=str))
except BaseException as err:
    print(json.dumps({key: (type(err).__name__ + ": " + str(err)).splitlines()[0][:300]}))
"""


@dataclass
class Settings:
    values: dict[str, Any]  # ServerArgs field -> value
    parser: str  # which parser gave them, in words
    eagle: bool  # the speculative algorithm seeds the EAGLE draft state
    env: dict[str, str] = field(default_factory=dict)  # the server's environment
    turned_off_by: list[str] = field(default_factory=list)  # sglang's handlers that did
    not_evaluated: list[str] = field(default_factory=list)  # "handler (why)"
    unsettled: list[str] = field(default_factory=list)  # with any, never "not exposed"
    adjusted: bool = False  # the values are after sglang's own adjustments
    torch_build: str | None = None  # "cuda", "rocm" (is_cuda() is false), None: taken as CUDA
    torch_source: str = "the torch build not known here: taken as CUDA (--torch-build)"

    def get(self, name: str) -> Any:
        return self.values.get(name)


class NestedTooDeeply(ValueError):
    pass


def json_answer(text: str | bytes) -> Any:
    """Another process's JSON answer; one nested too deeply for the parser (a hostile answer)
    is a ValueError like any other text that is not JSON, never a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise NestedTooDeeply("nested too deeply") from None


def not_understood(what: str, next_step: str = _AS_RUN) -> BackportError:
    problem = f"configuration not understood: {what}; exposure unknown (never taken as safe)"
    return BackportError(Exit.EXPOSURE_UNKNOWN, problem, next_step)


def refused(release: str, why: str) -> BackportError:
    return not_understood(
        f"sglang {release} refuses these launch arguments ({why}): a server does not start "
        "with them, so they are not what the deployment runs"
    )


def read_launch_args(text: str) -> tuple[list[str], dict[str, str]]:
    """The options sglang's parser gets and the NAME=VALUE words before the command, as a
    shell runs it: `python -m sglang.launch_server`, `sglang serve` or the options alone."""
    pieces = _SHELL_PIECE.findall(text)  # the continuations (outside '...') joined first
    try:
        words = shlex.split("".join(p if p[0] == "'" else _ESCAPE.sub(r"\1", p) for p in pieces))
    except ValueError as err:
        raise BackportError(
            Exit.USAGE,
            f"--launch-args cannot be split as a shell would: {err}",
            "quote it as the chart or unit does, e.g. --launch-args '--model-path M ...'",
        ) from None
    at = 1 if words[:1] == ["exec"] else 0
    at += 1 if words[at : at + 1] == ["env"] else 0
    pairs = list(itertools.takewhile(_ENV_WORD.match, words[at:]))
    env, words = parse_env(pairs), words[at + len(pairs) :]
    head = words[0] if words else "-"
    if re.match(r"^(?:.*/)?python[0-9.]*$", head):
        at = 1
        while at < len(words) and words[at].startswith("-") and words[at] != "-m":
            at += 2 if words[at] in ("-X", "-W") else 1
        if words[at : at + 2] != ["-m", "sglang.launch_server"]:
            started = shlex.join(words[: at + 2])
            raise not_understood(
                f"--launch-args start {started!r}, not python -m sglang.launch_server"
            )
        return words[at + 2 :], env
    if re.match(r"^(?:.*/)?sglang$", head) and words[1:2] == ["serve"]:
        # its own --model-type taken out: a diffusion server is not judged here
        kept, kind, rest = [], "auto", iter(words[2:])
        for word in rest:
            name, eq, value = word.partition("=")
            if name == "--model-type" and (eq or (value := next(rest, None)) is not None):
                kind = value
            else:
                kept.append(word)
        if kind not in ("auto", "llm"):
            raise not_understood(f"sglang serve --model-type {kind}: not the language-model server")
        return kept, env
    if not head.startswith("-"):
        raise not_understood(
            f"--launch-args start with {head!r}: neither an option nor sglang serve or "
            "python -m sglang.launch_server"
        )
    return words, env


def place_config(args: list[str], config: Path | None, root: Path | None) -> list[str]:
    """args with the --config path as read here: --config FILE (a copy of the server's)
    replaces the one named or is added; a relative one is taken from --config-root."""
    at = config_at(args)
    if config is not None:
        if not config.is_file():
            raise not_understood(f"--config {config}: no such file here")
        path = config
    elif at is None:
        return args
    elif root is None and not Path(args[at + 1]).is_absolute():
        raise not_understood(
            f"--config {args[at + 1]} is relative to the server's working folder",
            "pass --config-root DIR (the folder the server starts in, as copied "
            "here) or --config FILE (a copy of the server's file)",
        )
    else:
        path = (root or Path()) / args[at + 1]  # an absolute path stays as it is
        if not path.is_file():
            raise not_understood(
                f"--config {args[at + 1]}: {path} is not a file here",
                "pass --config FILE with a copy of the server's file, or --config-root DIR",
            )
    try:  # small and plain: YAML aliases can expand past memory (sglang's too)
        size = path.stat().st_size
        text = "" if size > MAX_CONFIG_BYTES else path.read_text("utf-8", "replace")
    except OSError as err:
        raise not_understood(f"--config {path} cannot be read here: {err}") from None
    if size > MAX_CONFIG_BYTES:
        raise not_understood(f"--config {path} is {size} bytes, more than a launch config")
    if _YAML_ALIAS.search(text):
        raise not_understood(
            f"--config {path} holds YAML anchors or aliases (&name, *name), not expanded here",
            "write the values out in a copy of the file, and pass it with --config FILE",
        )
    head, tail = (args, []) if at is None else (args[:at], args[at + 2 :])
    return [*head, "--config", str(path), *tail]


def config_at(args: list[str]) -> int | None:
    """Where `--config PATH` is: sglang merges the file for that word only, once, with a path."""
    at = [n for n, word in enumerate(args) if word == "--config"]
    if len(at) > 1:
        raise not_understood("--config is given more than once (sglang refuses that)")
    if at and at[0] + 1 == len(args):
        raise not_understood("--config names no file (sglang refuses that)")
    return at[0] if at else None


def parse_env(pairs: list[str]) -> dict[str, str]:
    for pair in pairs:
        if pair.find("=") < 1:  # no "=", or no name before it
            raise BackportError(
                Exit.USAGE, f"--env {pair!r} is not NAME=VALUE", "pass e.g. --env FOO=1"
            )
    return dict(pair.split("=", 1) for pair in pairs)


def eagle_family(value: object, table: LaunchSettings) -> bool:
    return isinstance(value, str) and value.upper() in table.eagle_family


def merge_config(args: list[str], table: LaunchSettings, python: Path) -> list[str]:
    """args after the --config file's settings, as sglang's ConfigArgumentMerger puts them; the
    file read as sglang reads it, with python's PyYAML."""
    at = config_at(args)
    if at is None:
        return args
    path = args[at + 1]
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise not_understood(f"--config {path} is not a .yaml or .yml file (sglang refuses it)")
    try:
        result = subprocess.run(
            [str(python), "-c", _YAML_PROGRAM, path], capture_output=True, text=True, timeout=60
        )
        answer = json_answer((result.stdout.strip().splitlines() or ["null"])[-1])
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
    if "data" not in answer:  # not our program's answer: nothing can be vouched for
        raise not_understood(f"--config {path} could not be read with {python}: it said {answer}")
    if not isinstance(answer["data"], dict | None):
        raise not_understood(f"--config {path} holds no mapping at its top (sglang refuses it)")
    store_true = {f.field for f in table.flags.values() if isinstance(f.default, bool)}
    merged: list[str] = []
    for key, value in (answer["data"] or {}).items():
        option = f"--{key}"
        if isinstance(value, bool) and str(key).replace("-", "_") in store_true:
            merged += [option] if value else []
        elif isinstance(value, bool):
            merged += [option, str(value).lower()]
        elif isinstance(value, list):
            merged += [option, *map(str, value)] if value else []
        else:
            merged += [option, json.dumps(value) if isinstance(value, dict) else str(value)]
    return merged + args[:at] + args[at + 2 :]


def parse_with_table(
    args: list[str], table: LaunchSettings, why: str, python: Path | None = None
) -> Settings:
    """The settings that matter, read with the release's [launch] table by argparse's rules."""
    args = merge_config(args, table, python or Path(sys.executable))
    flags = {flag.flag: flag for flag in table.flags.values()}
    known = [*flags, *NEUTRAL]
    values = {**dict.fromkeys(FIELDS), **{n: f.default for n, f in table.flags.items()}}
    release, unknown, unsettled = table.release, [], []
    words, after_unknown = iter(args), False
    for word in words:
        if word == "--" or not word.startswith("-") or word == "-":
            if after_unknown:
                continue  # a value of an option the table does not know
            raise refused(release, f"{word!r} is not an option, and it takes none")
        name, eq, value = word.partition("=")
        matches = [name] if name in known else [o for o in known if o.startswith(name)]
        after_unknown = not name.startswith("--") or not matches
        if after_unknown:
            unknown.append(word)
            continue
        if len(matches) > 1:
            raise refused(release, f"{name} is ambiguous: {', '.join(matches)}")
        option = matches[0]
        if option != name:
            unsettled.append(
                f"{name} read as {option} (argparse takes a unique start of an option; "
                "the table does not hold every option of the release to tell)"
            )
        flag = flags.get(option)
        if flag is not None and isinstance(flag.default, bool):
            if eq:
                raise refused(release, f"{option} takes no value ({word!r})")
            values[flag.field] = True
            continue
        if not eq:
            value = next(words, None)  # an option next is no value: refused either way
            if value is None or (value.startswith("-") and value != "-"):
                raise refused(release, f"{option} expects one value")
        if flag and flag.field == "disaggregation_mode" and value not in DISAGGREGATION_MODES:
            choices = ", ".join(DISAGGREGATION_MODES)
            raise refused(release, f"{option}: invalid choice {value!r} (choose from {choices})")
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
    parser = (
        f"the launch profile [launch.{table.profile}] that sglang {release} names in "
        f"releases.toml ({why}); sglang's own adjustments were not evaluated"
    )
    return Settings(values, parser, eagle, unsettled=unsettled)
