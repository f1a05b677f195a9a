"""check-install with a deployment's configuration: every release's real ServerArgs, a
local /server_info, the bad answers, and an affected install against a patched one."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from checkinstall import install as installs
from checkinstall.exposure import FIELDS, HISPARSE_SCENARIO, Exposure, judge
from checkinstall.launchargs import parse_with_table
from checkinstall.serverargs import (
    SERVER_ARGS_PROBE,
    probe_request,
    read_probe,
)
from command_server import check_install
from conftest import SCRIPTS
from patchset import catalog as catalogs
from patchset import paths
from patchset.errors import BackportError, Exit
from patchset.lock import TEMP_MARKER, TEMP_MARKER_TEXT
from patchset.manifest import series_for_release
from patchset.releases import load_releases
from testrun.venv import env_for

RELEASES = sorted(load_releases().launch)
DEFAULT = paths.DEFAULT_BASE
STEPS = paths.PROJECT_ROOT / "build" / "steps"
DECODE_EAGLE = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"


def check(
    *args: str,
    tree_on_path: Path | None = None,
    cwd: Path | None = None,
    fresh: bool = False,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """check-install ARGS in a child of the command server; fresh: in an interpreter of
    its own (the one end-to-end run of --python's probe)."""
    env = dict(os.environ, **env)
    if tree_on_path is not None:
        env["PYTHONPATH"] = str(tree_on_path)
    if fresh:
        command = [sys.executable, str(SCRIPTS / "check-install"), *args]
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    else:
        result = check_install(*args, env=env, cwd=cwd, timeout=600)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def line(result: subprocess.CompletedProcess[str], start: str) -> str:
    found = re.search(rf"^{re.escape(start)}.*$", result.stdout, re.M)
    assert found, result.stdout + result.stderr
    return found[0]


def release_paths(release: str) -> tuple[Path, Path, bool]:
    """The release's test interpreter, its unpatched step tree (made by scripts/run-tests),
    and whether both are there."""
    python = env_for(series_for_release(paths.PATCHES_ROOT, release).manifest).python
    tree = STEPS / release / "base" / "python"
    return python, tree, python.exists() and (tree / "sglang").is_dir()


def release_env(release: str) -> tuple[Path, Path]:
    """release_paths, or the test skips saying what is missing."""
    python, tree, there = release_paths(release)
    if not there:
        pytest.skip(f"needs {python} and {tree}: run scripts/run-tests once")
    return python, tree


def server_args_script(body: str) -> str:
    return (
        "import argparse, dataclasses, json\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser()\nServerArgs.add_cli_args(p)\n" + body
    )


ACTIONS = server_args_script(
    "print(json.dumps([[a.dest, a.option_strings, a.default, list(a.choices or [])]\n"
    "                  for a in p._actions]))"
)
FIELDS_SERVED = server_args_script(
    "a = p.parse_args(['--model-path', 'dummy'])\n"
    "print(json.dumps(dataclasses.asdict(ServerArgs.from_cli_args(a)), default=str))"
)
# The launch arguments played with each release's own ServerArgs (check-install's probe).
CONFIGURATIONS = {
    "eagle": DECODE_EAGLE,
    "mps": "--model-path m --disaggregation-mode decode --device mps",
    "prefill": "--model-path m --disaggregation-mode prefill",
    "off": DECODE_EAGLE + " --disable-overlap-schedule",
    "bad": "--model-path m --tp-size many",
    # sglang's prepare_server_args merges a --config YAML first (the command line wins)
    "config": "--config {yaml}",
    "config-overridden": "--config {yaml} --disaggregation-mode prefill",
    "config-not-yaml": "--model-path m --config {txt}",
    # no --model-path: not an error for the verdict
    "no-model": "--disaggregation-mode decode --speculative-algorithm EAGLE",
    "choice": "--model-path m --disaggregation-mode Decode",
    # sglang's handler would make an absolute dump folder where it points
    "dump-elsewhere": DECODE_EAGLE + " --crash-dump-folder {elsewhere}",
}
# The decode + EAGLE configuration as a --config file, with the model path in it.
DECODE_EAGLE_YAML = "model-path: m\ndisaggregation-mode: decode\nspeculative-algorithm: EAGLE\n"


def words(config: str, files: Path) -> list[str]:
    """A configuration's launch arguments, with its files' paths under files."""
    named = {"yaml": files / "decode.yaml", "txt": files / "decode.txt"}
    return shlex.split(config.format(**named, elsewhere=files / "elsewhere" / "dumps"))


@dataclass(frozen=True)
class Probed:
    """What one program printed, run as `python -c` with a release's base tree on the path."""

    python: Path
    tree: Path
    files: Path  # where the configurations' files are
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        assert self.returncode == 0, self.stderr[-2000:]
        return json.loads(self.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Probed]]:
    """release -> program -> what it printed: the launch table's dump, the served fields
    (the default release's) and check-install's own ServerArgs probe for each of
    CONFIGURATIONS.

    One interpreter per test environment runs them all (probe_trees.py: it imports
    torch and the rest once, then forks per tree and per program), at once for the
    three environments; a command line each would import them some thirty times.
    """
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "decode.yaml").write_text(DECODE_EAGLE_YAML)
    (tmp / "decode.txt").write_text(DECODE_EAGLE_YAML)
    by_python: dict[Path, list[dict]] = {}
    trees: dict[str, tuple[Path, Path]] = {}
    for release in RELEASES:
        python, tree, there = release_paths(release)
        if not there:
            continue  # its tests skip (probe_of)
        table = load_releases().launch[release]
        programs = {"actions": [ACTIONS, ""]}
        if release == DEFAULT:  # the fields /server_info serves (server_args_fields)
            programs["fields"] = [FIELDS_SERVED, ""]
        for name, text in CONFIGURATIONS.items():
            request = probe_request(words(text, tmp), {}, table)
            programs[name] = [SERVER_ARGS_PROBE, json.dumps(request)]
        by_python.setdefault(python, []).append({"tree": str(tree.parent), "programs": programs})
        trees[str(tree.parent)] = (python, tree)
    runs = []
    for n, (python, jobs) in enumerate(by_python.items()):
        jobs_file, results = tmp / f"jobs-{n}.json", tmp / f"results-{n}.json"
        jobs_file.write_text(json.dumps(jobs))
        proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("probe_trees.py")), str(jobs_file),
             str(results)],
            env=dict(os.environ, PYTHONPATH=str(SCRIPTS)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        runs.append((proc, results))
    answers: dict[str, dict[str, Probed]] = {}
    for proc, results in runs:
        output = proc.communicate(timeout=900)[0].decode(errors="replace")
        assert proc.returncode == 0, output[-3000:]
        for where, programs in json.loads(results.read_text()).items():
            python, tree = trees[where]
            release = tree.parent.parent.name
            answers[release] = {
                name: Probed(python, tree, tmp, **got) for name, got in programs.items()
            }
    return answers


def probe_of(probed: dict[str, dict[str, Probed]], release: str, name: str) -> Probed:
    if release not in probed:
        release_env(release)  # skips, saying what is missing
    return probed[release][name]


def verdict(got: Probed, release: str, config: str) -> Exposure:
    """check-install --python X --launch-args CONFIG on the release's base, from the
    probe's answer (what the command does with it, in this process)."""
    report = installs.inspect_tree(got.tree, catalogs.load_catalog(paths.PATCHES_ROOT))
    _code, install = report.verdict()
    content = report.matches[0]  # 0.5.13.post1's files are 0.5.13's: one content, one table
    assert release in content.name, content
    table = load_releases().launch[content.release]
    args = words(CONFIGURATIONS[config], got.files)
    try:
        settings = read_probe(got.python, args, table, got.returncode, got.stdout, got.stderr)
    except BackportError as refused:  # the lines say why, so a test can compare them
        return Exposure(refused.code, [f"verdict: refused: {refused}"])
    return judge(settings, dict(content.races), table, install)


def said(result: Exposure, start: str) -> str:
    found = [text for text in result.lines if text.startswith(start)]
    assert found, result.lines
    return found[0]


def test_exit_codes_of_issue_25():
    assert (Exit.EXPOSED, Exit.NOT_EXPOSED, Exit.AMBIGUOUS) == (25, 26, 27)


@pytest.mark.parametrize("release", RELEASES)
def test_launch_table_is_the_releases_own_parser(release: str, probed):
    """Each flag of the launch profile the release names, as that release spells it,
    with its default; no other option sets those fields (the table parser would miss
    it), --disaggregation-mode's choices are the table parser's, and --model-path
    (which it also reads) is there."""
    from checkinstall.launchargs import DISAGGREGATION_MODES, NEUTRAL

    listed = probe_of(probed, release, "actions").json()
    actions = {dest: [options, default, choices] for dest, options, default, choices in listed}
    table = load_releases().launch[release]
    for name in FIELDS:
        if name not in table.flags:
            assert name not in actions, f"{release} has {name}; add it to [launch]"
            continue
        flag = table.flags[name]
        assert flag.flag in actions[name][0], (release, name, actions[name])
        assert actions[name][1] == flag.default, (release, name, actions[name])
        setting = {o for dest, options, *_ in listed if dest == name for o in options}
        assert setting == {flag.flag}, (release, name, setting)
    assert actions["disaggregation_mode"][2] == list(DISAGGREGATION_MODES)
    assert set(actions["model_path"][0]) == set(NEUTRAL), actions["model_path"]


@pytest.mark.parametrize("release", RELEASES)
def test_verdicts_with_the_releases_own_server_args(release: str, probed):
    result = verdict(probe_of(probed, release, "eagle"), release, "eagle")
    assert f"sglang {release}'s own ServerArgs" in said(result, "configuration parsed by")
    assert "EAGLE family" in said(result, "speculative algorithm:")
    text = "\n".join(result.lines)
    if load_releases().launch[release].war_fast_path:
        # the fast path waits on a read-done event; the forward's later writes still race (L3)
        assert result.code == Exit.EXPOSED, text
        assert "scenarios L3; buffers output_tokens_buf, topk_p_buf" in text
    else:
        # 0.5.13 waits on the whole forward stream: L5, played with that, is ordered
        assert result.code == Exit.NOT_EXPOSED, text
        assert "fallback path (L5 played with it: ordered)" in text

    # a configuration that sglang itself adjusts: on mps it turns overlap off
    mps = verdict(probe_of(probed, release, "mps"), release, "mps")
    assert mps.code == Exit.NOT_EXPOSED, mps.lines
    assert "sglang turned it off (_handle_mps_backends)" in said(mps, "overlap scheduling:")


@pytest.mark.parametrize("release", RELEASES)
def test_prefill_server_and_no_overlap_are_out(release: str, probed):
    prefill = verdict(probe_of(probed, release, "prefill"), release, "prefill")
    assert prefill.code == Exit.NOT_EXPOSED, prefill.lines
    assert "--disaggregation-mode prefill (serving as decode" in said(prefill, "verdict:")
    off = verdict(probe_of(probed, release, "off"), release, "off")
    assert off.code == Exit.NOT_EXPOSED, off.lines
    assert "overlap off (--disable-overlap-schedule" in said(off, "verdict:")


@pytest.mark.slow
def test_the_command_runs_the_probe_in_the_interpreter_under_check(tmp_path: Path):
    """End to end: check-install --python runs the probe there, as a command line; the
    command as a unit writes it (continued lines, the module, a --config file named
    relative to the server's folder, which holds the model path) is read as sglang
    reads it. sglang's handlers run in a scratch folder: --crash-dump-folder dumps
    makes dumps/<host>/ where they run, not in the caller's folder nor its TMPDIR; a
    killed run's scratch folder there is removed. The tree is on PYTHONPATH relative to the
    caller's folder, which the probe, run in its scratch folder, still finds."""
    python, tree = release_env(DEFAULT)
    (tmp_path / "decode.yaml").write_text(DECODE_EAGLE_YAML)
    caller, tmp = tmp_path / "caller", tmp_path / "tmp"
    caller.mkdir()
    killed = tmp / "check-install-probe-0123456789abcdef"  # marked, its maker gone
    (killed / "dumps").mkdir(parents=True)
    (killed / TEMP_MARKER).write_bytes(TEMP_MARKER_TEXT)
    launch = (
        "python3 -m sglang.launch_server \\\n  --config decode.yaml \\\n  --log-level info"
        " --crash-dump-folder dumps"
    )
    result = check(
        "--python", str(python), "--launch-args", launch, "--config-root", str(tmp_path),
        cwd=caller, fresh=True, TMPDIR=str(tmp), PYTHONPATH=os.path.relpath(tree, caller),
    )  # fmt: skip
    assert result.returncode == Exit.EXPOSED, result.stdout + result.stderr
    assert f"sglang {DEFAULT}'s own ServerArgs" in line(result, "configuration parsed by")
    assert f"in {python}" in line(result, "configuration parsed by")
    assert "scenarios L3; buffers output_tokens_buf, topk_p_buf" in line(result, "verdict:")
    assert sorted(caller.iterdir()) == [] and sorted(tmp.iterdir()) == []


@pytest.mark.parametrize("release", RELEASES)
def test_the_probe_writes_nothing_outside_its_scratch_folder(release: str, probed):
    """An absolute --crash-dump-folder: sglang's handler would make it where it points;
    the probe refuses that write, and the settings are still read."""
    got = probe_of(probed, release, "dump-elsewhere")
    args = words(CONFIGURATIONS["dump-elsewhere"], got.files)
    table = load_releases().launch[release]
    settings = read_probe(got.python, args, table, got.returncode, got.stdout, got.stderr)
    assert f"sglang {release}'s own ServerArgs" in settings.parser, settings.parser
    assert settings.get("disaggregation_mode") == "decode"
    elsewhere = got.files / "elsewhere"
    assert not elsewhere.exists(), sorted(elsewhere.rglob("*"))


@pytest.mark.parametrize("release", RELEASES)
def test_arguments_the_release_does_not_parse_are_refused(release: str, probed):
    """What sglang's own parser refuses is no configuration a server runs: 28, never 26."""
    bad = verdict(probe_of(probed, release, "bad"), release, "bad")
    assert bad.code == Exit.EXPOSURE_UNKNOWN, bad.lines
    assert "--tp-size" in bad.lines[-1] and "many" in bad.lines[-1], bad.lines
    choice = verdict(probe_of(probed, release, "choice"), release, "choice")
    assert choice.code == Exit.EXPOSURE_UNKNOWN, choice.lines
    assert "invalid choice: 'Decode'" in choice.lines[-1], choice.lines


@pytest.mark.parametrize("release", RELEASES)
def test_config_file_is_merged_as_the_release_merges_it(release: str, probed):
    """--config decode.yaml (decode, EAGLE and the model path in the file) is judged as
    the same options on the command line; the command line's own options win."""
    eagle = verdict(probe_of(probed, release, "eagle"), release, "eagle")
    config = verdict(probe_of(probed, release, "config"), release, "config")
    assert config.code == eagle.code, config.lines
    assert said(config, "disaggregation mode:").startswith("disaggregation mode: decode")
    assert "EAGLE family" in said(config, "speculative algorithm:")
    overridden = verdict(
        probe_of(probed, release, "config-overridden"), release, "config-overridden"
    )
    assert overridden.code == Exit.NOT_EXPOSED, overridden.lines
    assert "--disaggregation-mode prefill (serving as decode" in said(overridden, "verdict:")
    # a file sglang's ConfigArgumentMerger refuses: the server does not start with it
    txt = verdict(probe_of(probed, release, "config-not-yaml"), release, "config-not-yaml")
    assert txt.code == Exit.EXPOSURE_UNKNOWN, txt.lines
    assert "ConfigArgumentMerger" in txt.lines[-1] and "YAML" in txt.lines[-1], txt.lines


@pytest.mark.parametrize("release", RELEASES)
def test_no_model_path_is_not_an_error_for_the_verdict(release: str, probed):
    eagle = verdict(probe_of(probed, release, "eagle"), release, "eagle")
    no_model = verdict(probe_of(probed, release, "no-model"), release, "no-model")
    assert no_model.code == eagle.code, no_model.lines
    assert no_model.lines[1:] == eagle.lines[1:]


def test_bare_copy_falls_back_to_the_table(tmp_path: Path):
    """sglang's files without its dependencies: ServerArgs cannot be imported, the table parses."""
    _python, tree = release_env(DEFAULT)
    bare = tmp_path / "bare"
    for path in ("sglang/__init__.py", "sglang/srt/server_args.py"):
        (bare / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tree / path, bare / path)
    for path in load_releases().known[DEFAULT].blobs:
        target = bare / path.removeprefix("python/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tree / path.removeprefix("python/"), target)
    result = check(
        "--python", sys.executable, "--launch-args", DECODE_EAGLE + " --device npu",
        tree_on_path=bare,
    )  # fmt: skip
    parsed = line(result, "configuration parsed by")
    profile = load_releases().launch[DEFAULT].profile
    assert f"[launch.{profile}] that sglang {DEFAULT} names" in parsed
    assert "cannot be imported there" in parsed
    assert result.returncode == Exit.EXPOSED, result.stdout
    assert "the WAR barrier is off" in line(result, "device: npu")
    assert "L1, S1, S2, S4, S6, S8; buffers new_seq_lens_buf" in result.stdout


def test_affected_against_patched_tree():
    base, final = STEPS / DEFAULT / "base" / "python", STEPS / DEFAULT / "0002" / "python"
    if not final.is_dir():
        pytest.skip(f"needs {final}: run scripts/run-tests once")
    affected = check("--tree", str(base), "--launch-args", DECODE_EAGLE)
    assert affected.returncode == Exit.EXPOSED, affected.stdout
    assert "--tree: no interpreter" in line(affected, "configuration parsed by")
    patched = check("--tree", str(final), "--launch-args", DECODE_EAGLE)
    assert patched.returncode == Exit.OK, patched.stdout
    assert line(patched, "verdict:").endswith("races closed; whatever the configuration")
    # an AMD GPU: sglang's device is cuda, but is_cuda() is false, so no barrier ...
    amd = ["--tree", str(base), "--torch-build", "rocm", "--launch-args"]
    off = check(*amd, DECODE_EAGLE)
    assert "the WAR barrier is off (is_cuda() is false" in line(off, "device: cuda")
    assert off.returncode == Exit.EXPOSED, off.stdout
    assert "scenarios L1, S1, S2, S4, S6, S8; buffers new_seq_lens_buf" in off.stdout
    # ... unless the server's environment turns it on; without graphs it waits on the
    # whole forward stream, and L5 (played with that) is ordered
    no_graphs = DECODE_EAGLE + " --disable-cuda-graph"
    env_on = check(*amd, no_graphs, "--env", "SGLANG_ENABLE_WAR_BARRIER=1")
    assert "SGLANG_ENABLE_WAR_BARRIER is set" in line(env_on, "device: cuda")
    assert env_on.returncode == Exit.NOT_EXPOSED, env_on.stdout
    assert "fallback path (L5 played with it: ordered)" in line(env_on, "verdict:")


# --- /server_info ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_args_fields(probed) -> dict[str, object]:
    """The fields of the default release's real ServerArgs, as /server_info serves them."""
    return probe_of(probed, DEFAULT, "fields").json()


class Server:
    """A /server_info on 127.0.0.1, in a thread, started and stopped by the test."""

    def __init__(self, body: bytes, status: int = 200, key: str = "", delay: float = 0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(delay)
                code = status
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    code = 401
                if self.path != "/server_info":
                    code = 404
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body if code == 200 else b'{"detail": "no"}')
                outer.requests += 1

            def log_message(self, *_args: object) -> None:
                pass

        self.requests = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, per server
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def base_tree() -> Iterator[Path]:
    _python, tree = release_env(DEFAULT)
    yield tree


def test_server_info_of_a_decode_server(server_args_fields: dict, base_tree: Path):
    info = dict(server_args_fields, disaggregation_mode="decode", speculative_algorithm="EAGLE")
    with Server(json.dumps(info).encode(), key="k3y") as server:
        result = check("--tree", str(base_tree), "--server-info", server.url, "--api-key", "k3y")
        assert server.requests == 1
    assert result.returncode == Exit.EXPOSED, result.stdout + result.stderr
    assert "/server_info (its values after sglang's own adjustments)" in result.stdout
    assert "scenarios L3" in line(result, "verdict:")
    prefill = dict(server_args_fields, disaggregation_mode="prefill")
    with Server(json.dumps(prefill).encode()) as server:
        result = check("--tree", str(base_tree), "--server-info", server.url + "/server_info")
    assert result.returncode == Exit.NOT_EXPOSED, result.stdout + result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ({"body": b"{}", "key": "k3y"}, "HTTP 401"),
        ({"body": b"{}", "status": 404}, "HTTP 404"),
        ({"body": b"<html>sglang</html>"}, "its answer is not JSON"),
        ({"body": b"[1, 2]"}, "holds no server arguments"),
        ({"body": b"{}", "delay": 3}, "no whole answer within 0.5 s (timed out)"),
        (None, "Connection refused"),
    ],
)
def test_server_info_bad_answers(server: dict | None, said: str, base_tree: Path):
    if server is None:
        result = check("--tree", str(base_tree), "--server-info", f"http://127.0.0.1:{free_port()}")
    else:
        with Server(**server) as running:
            result = check(
                "--tree", str(base_tree), "--server-info", running.url, "--timeout", "0.5"
            )  # fmt: skip
    assert result.returncode == Exit.ENVIRONMENT, result.stdout + result.stderr
    assert said in result.stderr and "next step:" in result.stderr, result.stderr


@pytest.mark.parametrize("h1", ["open", "clean", "absent"])
def test_hisparse_reads_its_race_table(h1: str):
    """--enable-hisparse rests on [races.H1] where the manifest has it."""
    manifest = series_for_release(paths.PATCHES_ROOT, DEFAULT).manifest
    races = {name: by_step["base"] for name, by_step in manifest.races.items()}
    row = (("write/write", ("output_tokens_buf",), (3,)),)
    if h1 == "absent":  # a release whose pin.toml has no [races.H1]
        races.pop(HISPARSE_SCENARIO, None)
    else:
        races[HISPARSE_SCENARIO] = row if h1 == "open" else ()
    table = load_releases().launch[DEFAULT]
    # a plain server (no PD) with hisparse: only the hisparse seam can reach the race
    settings = parse_with_table(["--enable-hisparse"], table, "test")
    result = judge(settings, races, table, "affected")
    hisparse = next(text for text in result.lines if text.startswith("hisparse:"))
    if h1 == "open":
        assert result.code == Exit.EXPOSED and "scenarios H1" in result.lines[-1]
    elif h1 == "clean":
        assert result.code == Exit.NOT_EXPOSED and "found ordered" in hisparse
    else:
        assert result.code == Exit.NOT_EXPOSED
        assert hisparse == "hisparse: on; not played for this release (no [races.H1])"


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            'enable-hisparse = { flag = "--enable-hisparse", default = false }',
            'enable-hisparse = { flag = "--enable-hisparse", default = true }',
            "enable-hisparse.default of a store_true flag must be false",
        ),
        (
            'device = { flag = "--device" }',
            'device = { flag = "device" }',
            'device.flag = "device" is not a long option',
        ),
        ("war-fast-path = true\n", "", "war-fast-path is missing"),
        ('eagle-family = ["EAGLE", ', "eagle-family = [1, ", "eagle-family is not a list"),
    ],
)
def test_damaged_launch_table_is_refused(tmp_path: Path, old: str, new: str, said: str):
    text = (paths.PATCHES_ROOT / "releases.toml").read_text()
    damaged = tmp_path / "releases.toml"
    damaged.write_text(text.replace(old, new, 1))
    with pytest.raises(BackportError) as refused:
        load_releases(damaged)
    assert refused.value.code == Exit.PATCHSET_INVALID
    assert said in refused.value.problem and "launch." in refused.value.problem
