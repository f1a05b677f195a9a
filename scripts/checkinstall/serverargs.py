"""The launch arguments as the checked interpreter's own ServerArgs reads them (its parser, then
__post_init__'s handlers; those that can turn overlap off named if they fail), else by [launch]."""

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from patchset.lock import marked_folder, tmpdir
from patchset.releases import LaunchSettings

from checkinstall import launchargs
from checkinstall.launchargs import FIELDS, Settings, not_understood, parse_with_table, refused

SERVER_ARGS_PROBE = r"""
import argparse, ast, contextlib, glob, inspect, io, json, logging, os, pathlib, sys, textwrap
sys.path[:] = [p for p in sys.path if p != ""]
request = json.loads(sys.argv[1])
os.environ.update(request["env"])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.disable(logging.CRITICAL)
sys.stdout = sys.stderr  # what sglang prints: the answer alone goes to the real stdout
def say(answer):
    print(json.dumps(answer, default=str), file=sys.__stdout__)
    sys.exit(0)
def why(err):
    text = (str(err).splitlines() or [""])[0]
    return (type(err).__name__ + (": " + text if text else ""))[:200]
try:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
except BaseException as err:
    say({"import_error": why(err)})
# sglang's handlers run from here: they may write in this scratch folder (the cwd) only
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
    if (writes if event == "open" else event in CHANGES) and args and outside(args[0]):
        raise PermissionError(13, "check-install's probe writes nowhere but here", args[0])
sys.addaudithook(guard)
parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
ServerArgs.add_cli_args(parser)
argv = request["args"]
said = io.StringIO()
if "--config" in argv:  # as prepare_server_args: the file's settings, then the command's
    try:
        with contextlib.redirect_stderr(said):
            from sglang.srt.server_args_config_parser import ConfigArgumentMerger
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    except BaseException as err:
        say({"config_error": why(err)})
try:
    with contextlib.redirect_stderr(said):  # a model path first: one given anywhere wins
        args = parser.parse_args(["--model-path", "dummy", *argv])
except (SystemExit, argparse.ArgumentError) as err:
    say({"parse_error": (said.getvalue().strip().splitlines() or [str(err)])[-1]})
model_path, args.model_path = args.model_path, "dummy"  # __post_init__ stops at once for it
server = ServerArgs.from_cli_args(args)
server.model_path = model_path
device_given = server.device
server.device = request["device"] if device_given is None else device_given
given = {name: getattr(server, name, None) for name in request["fields"]}
# What can turn overlap off: the functions of server_args.py, spec_info.py and arg_groups/
# that set disable_overlap_schedule to True, and all that name them.
OFF = "disable_overlap_schedule"
srt = os.path.dirname(os.path.abspath(inspect.getfile(ServerArgs)))
sources = [os.path.join(srt, "server_args.py"), os.path.join(srt, "speculative", "spec_info.py")]
sources += sorted(glob.glob(os.path.join(srt, "arg_groups", "*.py")))
def const(node):
    return node.value if isinstance(node, ast.Constant) else None
def sets_off(function):  # x.disable_overlap_schedule = True, x[...] = True, {...: True}
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) and const(node.value) is True else []
        if any(OFF in (getattr(t, "attr", ""), const(getattr(t, "slice", None))) for t in targets):
            return True
        pairs = zip(node.keys, node.values) if isinstance(node, ast.Dict) else ()
        if any(const(key) == OFF and const(value) is True for key, value in pairs):
            return True
    return False
names, reach = {}, set()
for source in filter(os.path.isfile, sources):
    for node in ast.walk(ast.parse(pathlib.Path(source).read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node)}
            names.setdefault(node.name, set()).update(used - {node.name, None})
            reach |= {node.name} if sets_off(node) else set()
while more := {name for name, used in names.items() if name not in reach and used & reach}:
    reach |= more
def overlap_off():
    try:
        from sglang.srt.arg_groups.overrides import resolved_view
        return bool(getattr(resolved_view(server), OFF))
    except BaseException:
        return bool(server.disable_overlap_schedule)
def self_call(statement):  # NAME for a statement `self.NAME(...)`, else None
    method = getattr(statement.value, "func", None) if isinstance(statement, ast.Expr) else None
    ok = isinstance(method, ast.Attribute) and getattr(method.value, "id", "") == "self"
    return method.attr if ok else None
def dispatcher(function):  # __post_init__, or the one method it hands everything to (0.5.18)
    body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and self_call(body[0]) and not body[0].value.args:
        return dispatcher(getattr(ServerArgs, self_call(body[0])))
    return body
turned_off_by, not_evaluated = [], []
for statement in dispatcher(ServerArgs.__post_init__):  # its handlers, one by one
    name = self_call(statement)
    if name is None or statement.value.args or statement.value.keywords:
        calls = ast.walk(statement) if name is None else [statement.value]
        called = [getattr(c.func, "attr", None) for c in calls if isinstance(c, ast.Call)]
        not_evaluated += [[c, "it takes values computed on the GPU"] for c in called if c in reach]
        continue
    before = overlap_off()
    try:
        getattr(server, name)()
    except (Exception, SystemExit) as err:  # a Ctrl-C still stops the probe
        not_evaluated += [[name, why(err)]] if name in reach else []
        continue
    if overlap_off() and not before:
        turned_off_by.append(name)
values = {name: getattr(server, name, None) for name in request["fields"]}
values.update(disable_overlap_schedule=overlap_off(), device=device_given)
algorithm = values["speculative_algorithm"] or given["speculative_algorithm"]
try:
    eagle = bool(algorithm) and SpeculativeAlgorithm.from_string(algorithm).is_eagle()
except BaseException:
    eagle = str(algorithm).upper() in request["eagle_family"]
torch_build, version = None, "unknown"
with contextlib.suppress(BaseException):
    import torch
    torch_build = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else None
with contextlib.suppress(BaseException):
    from sglang.version import __version__ as version
say({"version": version, "given": given, "torch_build": torch_build, "values": values,
     "eagle": eagle, "turned_off_by": turned_off_by, "not_evaluated": not_evaluated})
"""

DEFAULT_DEVICE = "cuda"  # sglang's pick without --device when torch sees a GPU


def probe_request(args: list[str], env: dict[str, str], table: LaunchSettings) -> dict[str, Any]:
    """What SERVER_ARGS_PROBE is given (its one argument, in JSON)."""
    family = sorted(table.eagle_family)
    return dict(args=args, env=env, fields=list(FIELDS), device=DEFAULT_DEVICE, eagle_family=family)


def parse_with_server_args(
    python: Path, args: list[str], env: dict[str, str], table: LaunchSettings
) -> Settings:
    """The settings as python's own sglang parses args; the table's where it cannot."""
    command = [str(python), "-c", SERVER_ARGS_PROBE, json.dumps(probe_request(args, env, table))]
    # sglang's handlers write where they run, and temporary files: in a folder of their own
    path = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    try:
        with marked_folder(tmpdir(), "check-install-probe-") as tmp:  # a killed run's: swept
            scratch = dict(os.environ, TMPDIR=str(tmp), TEMP=str(tmp), TMP=str(tmp))
            scratch["PYTHONPATH"] = os.pathsep.join(path)  # relative entries: the caller's folders
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=300, cwd=tmp, env=scratch
            )
    except (OSError, subprocess.TimeoutExpired) as err:
        why = f"sglang's ServerArgs could not be run there (in a scratch folder of its own): {err}"
        return parse_with_table(args, table, why, python)
    return read_probe(python, args, table, result.returncode, result.stdout, result.stderr)


def read_probe(
    python: Path, args: list[str], table: LaunchSettings, returncode: int, stdout: str, stderr: str
) -> Settings:
    """The settings SERVER_ARGS_PROBE printed; the table's where it could not run them."""
    answer = None
    with contextlib.suppress(ValueError):
        answer = launchargs.json_answer((stdout.strip().splitlines() or [""])[-1])
    if not isinstance(answer, dict) or "import_error" in answer:
        last = (stderr.strip().splitlines() or ["no output"])[-1][:160]
        why = f"failed there (exit {returncode}: {last})"
        if isinstance(answer, dict):
            why = f"cannot be imported there: {answer['import_error']}"
        return parse_with_table(args, table, f"sglang's ServerArgs {why}", python)
    if "config_error" in answer:
        raise not_understood(
            f"--config: sglang's ConfigArgumentMerger in {python} refuses the file: "
            f"{answer['config_error']} (a server does not start with it)"
        )
    if "parse_error" in answer:
        raise refused(f"there ({python})", f"its ServerArgs parser says: {answer['parse_error']}")
    overlap_given_off = answer["given"].get("disable_overlap_schedule")
    settings = Settings(
        answer["values"],
        f"sglang {answer['version']}'s own ServerArgs (add_cli_args, from_cli_args) in {python}",
        bool(answer["eagle"]),
        turned_off_by=[] if overlap_given_off else list(answer["turned_off_by"]),
        not_evaluated=[f"{name} ({why})" for name, why in answer["not_evaluated"]],
        adjusted=True,
    )
    if answer["torch_build"]:
        settings.torch_build = answer["torch_build"]
        settings.torch_source = f"torch there is a {answer['torch_build'].upper()} build"
    return settings
