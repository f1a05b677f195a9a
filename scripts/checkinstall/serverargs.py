"""The launch arguments as the release's own ServerArgs reads them in the interpreter
under check; the release's [launch] profile where that interpreter cannot run it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from patchset.manifest import LaunchSettings

from checkinstall.launchargs import FIELDS, Settings, not_understood, parse_with_table, refused

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
# From here sglang's handlers run: what they write goes into this scratch folder
# (the cwd) only; a write anywhere else (an absolute --crash-dump-folder) is refused.
SCRATCH = os.path.realpath(os.getcwd()) + os.sep
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.symlink",
           "os.link", "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree"}
def outside(path):
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a file descriptor: opened before, or inside
    return not os.path.realpath(os.fsdecode(path)).startswith(SCRATCH)
def guard(event, args):
    if event == "open":
        mode, flags = args[1], args[2] or 0
        writes = (isinstance(mode, str) and set(mode) & set("wax+")) or flags & WRITES
        if writes and outside(args[0]):
            raise PermissionError(13, "check-install's probe writes nowhere", args[0])
    elif event in CHANGES and args and outside(args[0]):
        raise PermissionError(13, "check-install's probe changes nothing", args[0])
sys.addaudithook(guard)
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
    # NAME for a statement `self.NAME(...)`, else None
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
ON_GPU = "it takes values computed on the GPU"
for statement in body:
    name = self_call(statement)
    if name is None:
        for sub in ast.walk(statement):
            called = getattr(getattr(sub, "func", None), "attr", None)
            if isinstance(sub, ast.Call) and called in reach:
                not_evaluated.append([called, ON_GPU])
        continue
    if statement.value.args or statement.value.keywords:
        if name in reach:
            not_evaluated.append([name, ON_GPU])
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
