"""Whether a deployment's configuration reaches the race: its launch settings, judged.

The settings come from the launch arguments, parsed by the release's own
ServerArgs inside the interpreter under check (a probe, like install's), or,
where that cannot be imported, by the release's [launch] table in
patches/releases.toml; or from a running server's /server_info. The verdict
reads the race tables of the install's step ([races] of its pin.toml) and the
race checker's scenario catalogue. Standard library only (check-install).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from patchset.errors import BackportError, Exit
from patchset.manifest import LAUNCH_FLAGS, LaunchSettings, RaceEntry

# The hisparse seam (Scheduler._build_hisparse_decode_batch's stash), played by race-check.
HISPARSE_SCENARIO = "H1"
WAR_BARRIER_ENV = "SGLANG_ENABLE_WAR_BARRIER"
FIELDS = (*LAUNCH_FLAGS, "disable_decode_cuda_graph")
TIMEOUT_S = 10.0
TORCH_BUILDS = ("cuda", "rocm")


@dataclass
class Settings:
    """The launch settings that decide whether a deployment reaches the race."""

    values: dict[str, Any]  # ServerArgs field -> value
    parser: str  # which parser gave them, in words
    eagle: bool  # the speculative algorithm seeds the EAGLE draft state
    env: dict[str, str] = field(default_factory=dict)  # the server's environment (--env)
    turned_off_by: list[str] = field(default_factory=list)  # sglang's handlers that did
    not_evaluated: list[str] = field(default_factory=list)  # "handler (why)"
    adjusted: bool = False  # the values are after sglang's own adjustments
    # the server's torch build: "cuda", "rocm" (HIP: its GPU is "cuda" too, but is_cuda()
    # is false), or None (not known: taken as CUDA)
    torch_build: str | None = None
    torch_source: str = "the torch build not known here: taken as CUDA (--torch-build)"

    def get(self, name: str) -> Any:
        return self.values.get(name)


def split_launch_args(text: str) -> list[str]:
    """ARGS as a shell would split them, from the first long option on (a leading
    `python -m sglang.launch_server` is the command, not its arguments)."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise BackportError(
            Exit.USAGE,
            f"--launch-args cannot be split as a shell would: {err}",
            "quote it as the chart or unit does, e.g. --launch-args '--model-path M ...'",
        ) from None
    first = next((n for n, word in enumerate(words) if word.startswith("--")), len(words))
    return words[first:]


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


def parse_with_table(args: list[str], table: LaunchSettings, why: str) -> Settings:
    """The settings that matter, parsed with the release's [launch] table; the rest ignored."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in table.flags.values():
        if isinstance(flag.default, bool):
            parser.add_argument(flag.flag, dest=flag.field, action="store_true")
        else:
            parser.add_argument(flag.flag, dest=flag.field, default=flag.default)
    try:
        known, _rest = parser.parse_known_args(args)
    except argparse.ArgumentError as err:
        raise BackportError(
            Exit.USAGE,
            f"--launch-args: {err}",
            "pass the arguments as the launch command has them",
        ) from None
    values = {name: getattr(known, name, None) for name in FIELDS}
    return Settings(
        values,
        f'the table [launch."{table.release}"] of releases.toml ({why}); sglang\'s own '
        "adjustments were not evaluated",
        eagle_family(values["speculative_algorithm"], table),
    )


def from_server_info(
    url: str, api_key: str | None, table: LaunchSettings | None, timeout: float = TIMEOUT_S
) -> Settings:
    """The settings a running server reports at /server_info (after its own adjustments),
    waiting at most timeout seconds for its answer."""
    if not url.rstrip("/").endswith("server_info"):
        url = url.rstrip("/") + "/server_info"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read()
    except urllib.error.HTTPError as err:
        hint = {
            401: "pass the server's key with --api-key KEY",
            403: "pass the server's key with --api-key KEY",
            404: "point --server-info at an sglang server's /server_info (0.5.13 and later)",
        }.get(err.code, "check that the URL is an sglang server's /server_info")
        raise _unreachable(url, f"it answered HTTP {err.code} {err.reason}", hint) from None
    except urllib.error.URLError as err:
        raise _unreachable(url, f"no answer: {err.reason}", _UP) from None
    except TimeoutError:
        raise _unreachable(url, f"no answer within {timeout:g} s (timed out)", _UP) from None
    except OSError as err:
        raise _unreachable(url, f"no answer: {err}", _UP) from None
    try:
        info = json.loads(body)
    except ValueError:
        raise _unreachable(
            url, f"its answer is not JSON (starts {body[:60]!r})", "point it at /server_info"
        ) from None
    if isinstance(info, dict) and isinstance(info.get("server_args"), dict):
        info = info["server_args"]
    if not isinstance(info, dict) or "disaggregation_mode" not in info:
        raise _unreachable(
            url,
            "its JSON holds no server arguments (no disaggregation_mode)",
            "point it at an sglang server's /server_info",
        )
    values = {name: info.get(name) for name in FIELDS}
    algorithm = values["speculative_algorithm"]
    eagle = eagle_family(algorithm, table) if table else str(algorithm or "").startswith("EAGLE")
    return Settings(
        values,
        f"the running server's {url} (its values after sglang's own adjustments)",
        eagle,
        adjusted=True,
    )


_UP = "check that the server is up and the URL and port are right (curl URL), then run again"


def _unreachable(url: str, why: str, next_step: str) -> BackportError:
    return BackportError(Exit.ENVIRONMENT, f"--server-info {url}: {why}", next_step)


# Runs in the interpreter under check: that release's own ServerArgs parses the
# arguments (add_cli_args, then from_cli_args). __post_init__ stops at once for a
# dummy model path, so the handlers it dispatches run here one by one, each that
# can turn overlap off (by its source) named when it cannot run (no GPU, no model).
SERVER_ARGS_PROBE = r"""
import argparse, ast, contextlib, inspect, io, json, logging, os, sys, textwrap
sys.path[:] = [p for p in sys.path if p != ""]
request = json.loads(sys.argv[1])
os.environ.update(request["env"])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.disable(logging.CRITICAL)
def say(answer):
    print(json.dumps(answer, default=str))
    sys.exit(0)
def why(err):
    text = (str(err).splitlines() or [""])[0]
    return (type(err).__name__ + (": " + text if text else ""))[:200]
try:
    with contextlib.redirect_stdout(sys.stderr):
        from sglang.srt import server_args as module
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        ServerArgs = module.ServerArgs
except BaseException as err:
    say({"import_error": why(err)})
parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
ServerArgs.add_cli_args(parser)
said = io.StringIO()
try:
    with contextlib.redirect_stderr(said):
        args = parser.parse_args(request["args"])
except (SystemExit, argparse.ArgumentError) as err:
    say({"parse_error": (said.getvalue().strip().splitlines() or [str(err)])[-1]})
model_path = args.model_path
args.model_path = "dummy"
with contextlib.redirect_stdout(sys.stderr):
    server = ServerArgs.from_cli_args(args)
server.model_path = model_path
device_given = server.device
if server.device is None:
    server.device = request["device"]
given = {name: getattr(server, name, None) for name in request["fields"]}
# What can turn overlap off: functions of server_args.py, arg_groups/ and
# spec_info.py that set disable_overlap_schedule to True, and all that name them.
srt = os.path.dirname(os.path.abspath(module.__file__))
sources = [os.path.join(srt, "server_args.py"), os.path.join(srt, "speculative", "spec_info.py")]
groups = os.path.join(srt, "arg_groups")
if os.path.isdir(groups):
    sources += [os.path.join(groups, n) for n in sorted(os.listdir(groups)) if n.endswith(".py")]
OFF = "disable_overlap_schedule"
def true(node):
    return isinstance(node, ast.Constant) and node.value is True
def sets_off(node):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign) and true(sub.value):
            for target in sub.targets:
                if isinstance(target, ast.Attribute) and target.attr == OFF:
                    return True
                key = getattr(target, "slice", None)
                if isinstance(key, ast.Constant) and key.value == OFF:
                    return True
        if isinstance(sub, ast.Dict):
            for key, value in zip(sub.keys, sub.values):
                if isinstance(key, ast.Constant) and key.value == OFF and true(value):
                    return True
    return False
names, direct = {}, set()
for source in sources:
    if not os.path.isfile(source):
        continue
    with open(source, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names.setdefault(node.name, set()).update(used - {node.name})
            if sets_off(node):
                direct.add(node.name)
reach = set(direct)
while True:
    more = {name for name, used in names.items() if name not in reach and used & reach}
    if not more:
        break
    reach |= more
try:
    from sglang.srt.arg_groups.overrides import resolved_view
except BaseException:
    resolved_view = None
def overlap_off():
    try:
        return bool(getattr(resolved_view(server) if resolved_view else server, OFF))
    except BaseException:
        return bool(server.disable_overlap_schedule)
def self_call(statement):
    call = statement.value if isinstance(statement, ast.Expr) else None
    method = getattr(call, "func", None)
    if isinstance(method, ast.Attribute) and getattr(method.value, "id", "") == "self":
        return method.attr
    return None
def dispatcher(function):
    # __post_init__, or the one method it hands everything to (0.5.18's pipeline)
    body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and self_call(body[0]) and not body[0].value.args:
        return dispatcher(getattr(ServerArgs, self_call(body[0])))
    return body
body = dispatcher(ServerArgs.__post_init__)
turned_off_by, not_evaluated = [], []
for statement in body:
    call = statement.value if isinstance(statement, ast.Expr) else None
    method = getattr(call, "func", None)
    if not (isinstance(method, ast.Attribute) and getattr(method.value, "id", "") == "self"):
        for sub in ast.walk(statement):
            name = getattr(getattr(sub, "func", None), "attr", None)
            if isinstance(sub, ast.Call) and name in reach:
                not_evaluated.append([name, "it takes values computed on the GPU"])
        continue
    name = call.func.attr
    if call.args or call.keywords:
        if name in reach:
            not_evaluated.append([name, "it takes values computed on the GPU"])
        continue
    before = overlap_off()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            getattr(server, name)()
    except KeyboardInterrupt:
        raise
    except BaseException as err:
        if name in reach:
            not_evaluated.append([name, why(err)])
        continue
    if overlap_off() and not before:
        turned_off_by.append(name)
values = {name: getattr(server, name, None) for name in request["fields"]}
values["disable_overlap_schedule"] = overlap_off()
values["device"] = device_given
algorithm = values["speculative_algorithm"] or given["speculative_algorithm"]
try:
    eagle = bool(algorithm) and SpeculativeAlgorithm.from_string(algorithm).is_eagle()
except BaseException:
    eagle = str(algorithm).upper() in request["eagle_family"]
try:
    import torch
    torch_build = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else None
except BaseException:
    torch_build = None
try:
    from sglang.version import __version__ as version
except BaseException:
    version = "unknown"
say({"version": version, "given": given, "torch_build": torch_build, "values": values,
     "eagle": eagle, "turned_off_by": turned_off_by, "not_evaluated": not_evaluated})
"""

# Where --device is not given, sglang picks "cuda" when torch sees a GPU.
DEFAULT_DEVICE = "cuda"


def probe_request(args: list[str], env: dict[str, str], table: LaunchSettings) -> dict[str, Any]:
    """What SERVER_ARGS_PROBE is given (as its one argument, in JSON)."""
    return {
        "args": args,
        "env": env,
        "fields": list(FIELDS),
        "device": DEFAULT_DEVICE,
        "eagle_family": sorted(table.eagle_family),
    }


def parse_with_server_args(
    python: Path, args: list[str], env: dict[str, str], table: LaunchSettings
) -> Settings:
    """The settings as python's own sglang parses args; the table where it cannot."""
    request = probe_request(args, env, table)
    try:
        result = subprocess.run(
            [str(python), "-c", SERVER_ARGS_PROBE, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return parse_with_table(args, table, f"sglang's ServerArgs could not be run there: {err}")
    return read_probe(python, args, table, result.returncode, result.stdout, result.stderr)


def read_probe(
    python: Path, args: list[str], table: LaunchSettings, returncode: int, stdout: str, stderr: str
) -> Settings:
    """The settings from what SERVER_ARGS_PROBE printed (exit code, stdout, stderr); the
    table's where it could not import or run sglang's ServerArgs."""
    try:
        answer = json.loads((stdout.strip().splitlines() or [""])[-1])
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (stderr.strip().splitlines() or ["no output"])[-1][:160]
        return parse_with_table(
            args, table, f"sglang's ServerArgs failed there (exit {returncode}: {last})"
        )
    if "import_error" in answer:
        return parse_with_table(
            args, table, f"sglang's ServerArgs cannot be imported there: {answer['import_error']}"
        )
    if "parse_error" in answer:
        raise BackportError(
            Exit.USAGE,
            f"--launch-args do not parse as sglang there parses them: {answer['parse_error']}",
            "pass the arguments as the launch command has them (with --model-path)",
        )
    values = answer["values"]
    settings = Settings(
        values,
        f"sglang {answer['version']}'s own ServerArgs (add_cli_args, from_cli_args) in {python}",
        bool(answer["eagle"]),
        turned_off_by=list(answer["turned_off_by"]),
        not_evaluated=[f"{name} ({why})" for name, why in answer["not_evaluated"]],
        adjusted=True,
    )
    if answer["given"].get("disable_overlap_schedule"):
        settings.turned_off_by = []
    if answer["torch_build"]:
        settings.torch_build = answer["torch_build"]
        settings.torch_source = f"torch there is a {answer['torch_build'].upper()} build"
    return settings


# --- the verdict -------------------------------------------------------------------


class Scenario(Protocol):
    """A race-check scenario as its catalogue describes it (racecheck.catalogue.Play)."""

    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> str | None: ...  # the speculative path it plays (EAGLE), or None
    @property
    def barrier(self) -> str | None: ...  # none/fast/fallback in the loop, or None


@dataclass(frozen=True)
class Exposure:
    code: Exit
    lines: list[str]  # one setting per line, then the verdict


def _buffers(entries: list[RaceEntry]) -> list[str]:
    return list(dict.fromkeys(b for _kind, buffers, _rows in entries for b in buffers))


def judge(
    settings: Settings,
    races: Mapping[str, tuple[RaceEntry, ...]],
    table: LaunchSettings | None,
    install: str,
    scenarios: Iterable[Scenario],
) -> Exposure:
    """Whether this configuration reaches the races open in the install (races: the
    [races] entries at its step, scenario -> entries; scenarios: the race checker's
    catalogue). install: its verdict line."""
    lines = [f"configuration parsed by {settings.parser}"]
    keeps_out: list[str] = []  # the settings that keep the deployment out

    mode = str(settings.get("disaggregation_mode") or "null")
    if mode == "decode":
        lines.append("disaggregation mode: decode: the prebuilt path reaches the race")
    else:
        lines.append(
            f"disaggregation mode: {mode}: only decode seeds prebuilt rows, so this server "
            "does not reach the race"
        )
        keeps_out.append(
            f"--disaggregation-mode {mode} (serving as decode, --disaggregation-mode decode, "
            "exposes it)"
        )

    overlap_on = not settings.get("disable_overlap_schedule")
    if overlap_on:
        line = "overlap scheduling: on (no --disable-overlap-schedule"
        line += ", and sglang's adjustments that ran left it on)" if settings.adjusted else ")"
        if settings.not_evaluated:
            line += "; not evaluated here: " + "; ".join(settings.not_evaluated)
        lines.append(line)
    else:
        by = (
            f"sglang turned it off ({', '.join(settings.turned_off_by)})"
            if settings.turned_off_by
            else "--disable-overlap-schedule"
        )
        lines.append(f"overlap scheduling: off ({by}): one stream, nothing races")
        keeps_out.append(f"overlap off ({by}; turning overlap on exposes it)")

    algorithm = settings.get("speculative_algorithm") or "none"
    plays = [p for p in scenarios if bool(p.spec) == settings.eagle and p.name in races]
    if settings.eagle:
        lines.append(
            f"speculative algorithm: {algorithm} (EAGLE family): the seeding writes all five "
            "relay buffers"
        )
    else:
        lines.append(
            f"speculative algorithm: {algorithm} (not EAGLE): the seeding writes "
            "output_tokens_buf only"
        )

    device = str(settings.get("device") or DEFAULT_DEVICE)
    named = (
        device if settings.get("device") else f"{device} (not given: sglang picks cuda with a GPU)"
    )
    if device == "cuda" and settings.torch_build == "rocm":
        named += f", {settings.torch_source}"
    barrier_env = settings.env.get(WAR_BARRIER_ENV, "").lower() in ("1", "true", "yes", "on")
    if device == "cuda" and settings.torch_build != "rocm":
        on = f"is_cuda() ({settings.torch_source})"
    elif barrier_env and table is not None and table.war_barrier_env:
        on = f"{WAR_BARRIER_ENV} is set in the server's environment"
    else:
        on = ""
    if on:
        graphs_off = settings.get("disable_cuda_graph") or settings.get("disable_decode_cuda_graph")
        fast = bool(table and table.war_fast_path) and not graphs_off
        barrier = "fast" if fast else "fallback"
        why = (
            "a decode graph replay records the read-done event it waits on"
            if fast
            else "CUDA graphs are off: it waits on the whole forward stream"
            if graphs_off
            else "this release has no fast path: it waits on the whole forward stream"
        )
        lines.append(f"device: {named}: the WAR barrier is on, {on}; {barrier} path ({why})")
    else:
        barrier = "none"
        reason = (
            f"{WAR_BARRIER_ENV} is set, but this release reads it only on CUDA"
            if barrier_env
            else f"is_cuda() is false and {WAR_BARRIER_ENV} is not set (--env)"
        )
        lines.append(f"device: {named}: the WAR barrier is off ({reason})")
    loop = [p.name for p in plays if p.barrier == barrier]
    played = loop + ([p.name for p in plays if p.barrier is None] if barrier == "none" else [])
    open_ = [name for name in played if races.get(name)]
    if not open_ and played:
        keeps_out.append(
            f"the WAR barrier's {barrier} path ({', '.join(loop)} played with it: ordered); "
            "a device without the barrier, or another barrier path, exposes it"
        )

    hisparse = bool(settings.get("enable_hisparse"))
    hisparse_open = False  # the hisparse seam: a server's own prefill-to-decode transition
    if HISPARSE_SCENARIO not in races:
        lines.append(
            f"hisparse: {'on' if hisparse else 'off'}; not played for this release "
            f"(no [races.{HISPARSE_SCENARIO}])"
        )
    elif not hisparse:
        lines.append("hisparse: off (--enable-hisparse not given)")
    elif races[HISPARSE_SCENARIO]:
        lines.append(
            f"hisparse: on: the hisparse stash races at this step ({HISPARSE_SCENARIO} open)"
        )
        hisparse_open = mode != "prefill"
    else:
        lines.append(
            f"hisparse: on: {HISPARSE_SCENARIO} was played on this release's code and found ordered"
        )

    reaching = (open_ if mode == "decode" else []) + ([HISPARSE_SCENARIO] if hisparse_open else [])
    entries = [entry for name in reaching for entry in races[name]]
    if reaching and overlap_on:
        lines.append(
            f"verdict: exposed: {install}; this configuration reaches the race: scenarios "
            f"{', '.join(reaching)}; buffers {', '.join(_buffers(entries))}"
        )
        return Exposure(Exit.EXPOSED, lines)
    if not keeps_out:
        keeps_out.append("no scenario this configuration plays is open at this step")
    lines.append(
        f"verdict: not exposed: {install}; this configuration does not reach the race: "
        + "; ".join(keeps_out)
    )
    return Exposure(Exit.NOT_EXPOSED, lines)
