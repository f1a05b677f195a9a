"""Whether a deployment's configuration reaches the race: its launch settings, judged.

The settings come from the launch arguments, parsed by the release's own
ServerArgs inside the interpreter under check (a probe, like install's), or,
where that cannot be imported, by the release's [launch] table in
patches/releases.toml; or from a running server's /server_info. The verdict
reads the race tables of the install's step ([races] of its pin.toml) and the
race checker's scenario catalogue. Standard library only (check-install).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from patchset.errors import Exit
from patchset.manifest import LaunchSettings, RaceEntry

from checkinstall import serverinfo
from checkinstall.launchargs import (
    DISAGGREGATION_MODES,
    FIELDS,
    Settings,
    env_bool,
    not_understood,
    parse_with_table,
    refused,
)

# The hisparse seam (Scheduler._build_hisparse_decode_batch's stash), played by race-check.
HISPARSE_SCENARIO = "H1"
WAR_BARRIER_ENV = "SGLANG_ENABLE_WAR_BARRIER"
TIMEOUT_S = 10.0
TORCH_BUILDS = ("cuda", "rocm")


def eagle_family(value: object, table: LaunchSettings) -> bool:
    return isinstance(value, str) and value.upper() in table.eagle_family


# the fields /server_info gives as true or false; the others are strings or null
_SWITCHES = ("disable_overlap_schedule", "enable_hisparse", "disable_cuda_graph",
             "disable_decode_cuda_graph")  # fmt: skip


def from_server_info(
    url: str, api_key: str | None, table: LaunchSettings | None, timeout: float = TIMEOUT_S
) -> Settings:
    """The settings a running server reports at /server_info (after its own adjustments),
    within one deadline of timeout seconds for its whole answer."""
    info, shown = serverinfo.read_server_info(url, api_key, timeout)
    values = {name: info.get(name) for name in FIELDS}
    odd = [
        f"{name} is {value!r}"
        for name, value in values.items()
        if value is not None and not isinstance(value, bool if name in _SWITCHES else str)
    ]
    if values["disaggregation_mode"] not in DISAGGREGATION_MODES:
        odd.append(f"disaggregation_mode is {values['disaggregation_mode']!r}")
    if odd:
        raise not_understood(
            f"--server-info {shown} answers values no sglang server has: {'; '.join(odd)}",
            "point it at the sglang server itself (its host and port)",
        )
    algorithm = values["speculative_algorithm"]
    eagle = eagle_family(algorithm, table) if table else str(algorithm or "").startswith("EAGLE")
    return Settings(
        values,
        f"the running server's {shown} (its values after sglang's own adjustments)",
        eagle,
        adjusted=True,
    )


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
parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
ServerArgs.add_cli_args(parser)
argv = request["args"]
said = io.StringIO()
if "--config" in argv:  # as prepare_server_args: the file's settings, then the command's
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(said):
            from sglang.srt.server_args_config_parser import ConfigArgumentMerger
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    except BaseException as err:
        say({"config_error": why(err)})
try:
    with contextlib.redirect_stderr(said):
        # a model path first, so that one given anywhere (the file too) wins
        args = parser.parse_args(["--model-path", "dummy", *argv])
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
        scratch = Path(tempfile.mkdtemp(prefix="check-install-probe-"))
    except OSError as err:
        why = f"no scratch folder for sglang's handlers to run in: {err}"
        return parse_with_table(args, table, why, python)
    # sglang's handlers write where they run (--crash-dump-folder dumps, temporary
    # files): in a folder of their own, removed afterwards, not the caller's.
    try:
        (scratch / "tmp").mkdir()
        folder = str(scratch / "tmp")
        result = subprocess.run(
            [str(python), "-c", SERVER_ARGS_PROBE, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=scratch,
            env=dict(os.environ, TMPDIR=folder, TEMP=folder, TMP=folder),
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        why = f"sglang's ServerArgs could not be run there: {err}"
        return parse_with_table(args, table, why, python)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
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
        why = f"sglang's ServerArgs failed there (exit {returncode}: {last})"
        return parse_with_table(args, table, why, python)
    if "import_error" in answer:
        why = f"sglang's ServerArgs cannot be imported there: {answer['import_error']}"
        return parse_with_table(args, table, why, python)
    if "config_error" in answer:
        raise not_understood(
            f"--config: sglang's ConfigArgumentMerger in {python} refuses the file: "
            f"{answer['config_error']} (a server does not start with it)"
        )
    if "parse_error" in answer:
        raise refused(f"there ({python})", f"its ServerArgs parser says: {answer['parse_error']}")
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
    raw = settings.env.get(WAR_BARRIER_ENV)
    barrier_env = raw is not None and env_bool(raw) is True
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
        if barrier_env:
            reason = f"{WAR_BARRIER_ENV}={raw} is set, but this release reads it only on CUDA"
        elif raw is None:
            reason = f"is_cuda() is false and {WAR_BARRIER_ENV} is not set (--env)"
        elif env_bool(raw) is False:
            reason = f"is_cuda() is false and {WAR_BARRIER_ENV}={raw} is false"
        else:
            reason = (
                f"is_cuda() is false, and {WAR_BARRIER_ENV}={raw!r} is no value sglang's "
                "EnvBool reads (true/1/yes/y, false/0/no/n, any case): sglang warns and "
                "takes its default, false"
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
        if settings.unsettled:
            lines.append("not understood: " + "; ".join(settings.unsettled))
        lines.append(
            f"verdict: exposed: {install}; this configuration reaches the race: scenarios "
            f"{', '.join(reaching)}; buffers {', '.join(_buffers(entries))}"
        )
        return Exposure(Exit.EXPOSED, lines)
    if not keeps_out:
        keeps_out.append("no scenario this configuration plays is open at this step")
    if settings.unsettled:
        lines.append("not understood: " + "; ".join(settings.unsettled))
        lines.append(
            f"verdict: exposure unknown: {install}; as read, this configuration would not "
            f"reach the race ({'; '.join(keeps_out)}), but what was not understood may "
            "change that"
        )
        return Exposure(Exit.EXPOSURE_UNKNOWN, lines)
    lines.append(
        f"verdict: not exposed: {install}; this configuration does not reach the race: "
        + "; ".join(keeps_out)
    )
    return Exposure(Exit.NOT_EXPOSED, lines)
