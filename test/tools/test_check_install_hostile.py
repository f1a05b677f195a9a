"""check-install --launch-args as operators paste them, read by the release's [launch]
table (--tree: no interpreter to run sglang's ServerArgs): argparse's rules, sglang's
refusals, --config files, the environment. A configuration that is not understood is
exit 28, never 26 ("not exposed")."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from checkinstall import install, launchargs, serverargs
from patchset import paths
from patchset.errors import Exit
from test_check_install_config import DECODE_EAGLE_YAML, check, release_env

DEFAULT = paths.DEFAULT_BASE
# the WAR barrier: a decode EAGLE server on an AMD GPU (is_cuda() false), graphs off
ROCM = ("--torch-build", "rocm")
DECODE_EAGLE = "--model-path m --disaggregation-mode decode --speculative-algorithm EAGLE"
DECODE_EAGLE_NO_GRAPHS = DECODE_EAGLE + " --disable-cuda-graph"


# nine levels of nine aliases: 9**9 strings once expanded, from a file of a few lines
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.fixture(scope="module")
def base() -> Path:
    return release_env(DEFAULT)[1]


def judged(base: Path, launch: str, *more: str) -> tuple[int, str]:
    result = check("--tree", str(base), f"--launch-args={launch}", *more)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("launch", "code", "said"),
    [
        # argparse takes a unique start of an option: this is a decode server
        (
            "--disaggregation-mo decode --speculative-algorithm EAGLE --device npu",
            Exit.EXPOSED,
            "--disaggregation-mo read as --disaggregation-mode",
        ),
        # and here overlap would be off, if no other option of sglang starts so: not known
        (
            "--disable-overlap --disaggregation-mode decode --device npu",
            Exit.EXPOSURE_UNKNOWN,
            "--disable-overlap read as --disable-overlap-schedule",
        ),
        # values sglang refuses ("invalid choice"): no server runs with them
        ("--model-path m --disaggregation-mode Decode", Exit.EXPOSURE_UNKNOWN, "invalid choice"),
        # a pasted JSON array, a pasted Helm args list
        (
            '["--model-path", "m", "--disaggregation-mode", "prefill"]',
            Exit.EXPOSURE_UNKNOWN,
            "neither an option nor sglang serve",
        ),
        (
            "- --model-path\n- m\n- --disaggregation-mode\n- prefill",
            Exit.EXPOSURE_UNKNOWN,
            "'-' is not an option",
        ),
        ("--enable-hisparse=1", Exit.EXPOSURE_UNKNOWN, "--enable-hisparse takes no value"),
        ("--disaggregation-mode", Exit.EXPOSURE_UNKNOWN, "expects one value"),
        ("--disable- --device npu", Exit.EXPOSURE_UNKNOWN, "--disable- is ambiguous"),
        # an option the table does not know may be anything: not "not exposed"
        (
            "--model-path m --disaggregation-mode prefill --tp-size 2",
            Exit.EXPOSURE_UNKNOWN,
            "options the table does not read (sglang's own parser would take or refuse "
            "them): --tp-size",
        ),
        # another launcher in front: not read as sglang's options
        (
            "torchrun --nproc-per-node 2 -m sglang.launch_server --disaggregation-mode prefill",
            Exit.EXPOSURE_UNKNOWN,
            "--launch-args start with 'torchrun'",
        ),
        (
            "sglang serve --model-type diffusion --disaggregation-mode decode",
            Exit.EXPOSURE_UNKNOWN,
            "--model-type diffusion",
        ),
        # the table can still say 26, where every option is its own
        (
            "--model-path m --disaggregation-mode prefill",
            Exit.NOT_EXPOSED,
            "--disaggregation-mode prefill (serving as decode",
        ),
        # the = form, and the last of repeats wins
        (
            "--disaggregation-mode=prefill --speculative-algorithm=EAGLE --device=npu "
            "--disaggregation-mode=decode",
            Exit.EXPOSED,
            "disaggregation mode: decode",
        ),
        # the forms a shell line takes: the module, continued lines, sglang serve
        (
            "python3 -u -m sglang.launch_server \\\n  --disaggregation-mode decode \\\n"
            "  --device npu",
            Exit.EXPOSED,
            "device: npu",
        ),
        (
            "/opt/venv/bin/sglang serve --model-type llm --disaggregation-mode prefill",
            Exit.NOT_EXPOSED,
            "disaggregation mode: prefill",
        ),
    ],
)
def test_the_table_reads_the_options_as_sglang_does(base: Path, launch: str, code: Exit, said: str):
    got, out = judged(base, launch)
    assert got == code, out
    assert said in out, out


def test_an_environment_prefix_is_the_servers_environment(base: Path):
    launch = f"SGLANG_ENABLE_WAR_BARRIER=1 python3 -m sglang.launch_server {DECODE_EAGLE_NO_GRAPHS}"
    got, out = judged(base, launch, *ROCM)
    assert "SGLANG_ENABLE_WAR_BARRIER is set" in out, out
    assert got == Exit.NOT_EXPOSED, out  # the barrier's fallback path orders L5


@pytest.mark.parametrize(
    ("value", "code", "said"),
    [
        # sglang's EnvBool: true/1/yes/y in any case; anything else falls back to false
        ("on", Exit.EXPOSED, "SGLANG_ENABLE_WAR_BARRIER='on' is no value sglang's EnvBool reads"),
        ("enabled", Exit.EXPOSED, "sglang warns and takes its default, false"),
        ("y", Exit.NOT_EXPOSED, "SGLANG_ENABLE_WAR_BARRIER is set"),
        ("YES", Exit.NOT_EXPOSED, "SGLANG_ENABLE_WAR_BARRIER is set"),
        ("0", Exit.EXPOSED, "SGLANG_ENABLE_WAR_BARRIER=0 is false"),
    ],
)
def test_environment_values_are_read_as_envbool_reads_them(
    base: Path, value: str, code: Exit, said: str
):
    got, out = judged(
        base, DECODE_EAGLE_NO_GRAPHS, *ROCM, "--env", f"SGLANG_ENABLE_WAR_BARRIER={value}"
    )
    assert said in line_of(out, "device:"), out
    assert got == code, out


def line_of(out: str, start: str) -> str:
    return next((text for text in out.splitlines() if text.startswith(start)), out)


@pytest.fixture
def decode_yaml(tmp_path: Path) -> Path:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "decode.yaml"
    path.write_text(DECODE_EAGLE_YAML + "device: npu\n")
    return path


def test_a_config_file_in_the_launch_args(base: Path, decode_yaml: Path):
    """--config conf/decode.yaml, relative to the server's folder (--config-root)."""
    root = str(decode_yaml.parent.parent)
    got, out = judged(base, "--config conf/decode.yaml", "--config-root", root)
    assert got == Exit.EXPOSED, out
    assert "disaggregation mode: decode" in out and "EAGLE family" in out, out
    # the command line's own options come after the file's, and win
    got, out = judged(base, "--config conf/decode.yaml --disaggregation-mode prefill",
                      "--config-root", root)  # fmt: skip
    assert got == Exit.NOT_EXPOSED, out
    # without the server's folder, a relative path is not read from this one
    got, out = judged(base, "--config conf/decode.yaml")
    assert got == Exit.EXPOSURE_UNKNOWN, out
    assert "pass --config-root DIR" in out, out


def test_a_config_file_on_the_command_line(base: Path, decode_yaml: Path):
    got, out = judged(base, "--config /etc/sglang/decode.yaml", "--config", str(decode_yaml))
    assert got == Exit.EXPOSED, out
    got, out = judged(base, "", "--config", str(decode_yaml))
    assert got == Exit.EXPOSED, out
    result = check("--tree", str(base), "--config", str(decode_yaml))
    assert result.returncode == Exit.EXPOSED, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("- not\n- a mapping\n", "holds no mapping at its top"),
        ("disaggregation-mode: [decode\n", "is not YAML sglang reads"),
        pytest.param(BILLION_LAUGHS, "holds YAML anchors or aliases", id="billion-laughs"),
        pytest.param("model-path: m\n" + "#" * (2 << 20), "more than a launch config", id="2-MiB"),
    ],
)
def test_a_config_file_sglang_refuses(base: Path, tmp_path: Path, text: str, said: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    got, out = judged(base, "--disaggregation-mode prefill", "--config", str(bad))
    assert got == Exit.EXPOSURE_UNKNOWN, out
    assert said in out, out


def test_config_with_an_equals_sign_is_not_merged_by_sglang(base: Path, decode_yaml: Path):
    """prepare_server_args merges only the two words --config PATH: with --config=PATH the
    server starts without the file's settings; the table cannot vouch for that."""
    got, out = judged(base, f"--config={decode_yaml} --disaggregation-mode prefill")
    assert got == Exit.EXPOSURE_UNKNOWN, out
    assert f"--config={decode_yaml}" in out, out


def test_a_config_file_without_pyyaml_is_refused(base: Path, decode_yaml: Path, tmp_path: Path):
    """--python of an interpreter without PyYAML (nor sglang's dependencies): the file
    cannot be read as sglang reads it."""
    python = tmp_path / "python-without-site"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    result = check("--python", str(python), "--config", str(decode_yaml), tree_on_path=base)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    assert "has no PyYAML to read it as sglang does" in result.stderr, result.stderr


def test_a_config_reader_that_answers_nothing_usable_is_refused(
    base: Path, decode_yaml: Path, tmp_path: Path
):
    """An interpreter (without sglang's dependencies, so the file is read by our reader, as
    in the test above) whose answer to the YAML reader is a JSON object without the file's
    data: the file's settings are unknown, so is the exposure (not a traceback)."""
    python = tmp_path / "python-answering-nothing"
    python.write_text(
        "#!/bin/sh\n"
        'case "$2" in *"import yaml"*) echo "{}"; exit 0;; esac\n'
        f'exec {sys.executable} -S "$@"\n'  # without site: our reader reads the file
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    result = check("--python", str(python), "--config", str(decode_yaml), tree_on_path=base)
    assert result.returncode == Exit.EXPOSURE_UNKNOWN, result.stdout + result.stderr
    assert "could not be read with" in result.stderr and "it said {}" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# an answer nested deeper than Python's JSON parser goes (it raises RecursionError)
NESTED = f'exec {sys.executable} -c \'print("[" * 100_000 + "]" * 100_000)\''


@pytest.mark.parametrize(
    ("asked", "more", "code", "said"),
    [
        # check-install's own question: which sglang, from which distribution
        ("importlib.metadata as md", (), Exit.ENVIRONMENT, "its answer is not JSON (nested too"),
        # the reader of a --config file, as sglang reads it
        ("import yaml", ("--config",), Exit.EXPOSURE_UNKNOWN, "could not be read with"),
        # sglang's own ServerArgs, run there: set aside, the release's table reads the options
        ("ServerArgs", ("--launch-args", DECODE_EAGLE), Exit.EXPOSED, "verdict: exposed"),
    ],
)
def test_an_answer_nested_too_deeply_is_no_json_not_a_traceback(
    base: Path, decode_yaml: Path, tmp_path: Path, asked: str, more: tuple, code: Exit, said: str
):
    """An interpreter that answers one of check-install's programs with JSON nested deeper
    than the parser goes: that answer is taken as one that is not JSON (refused, or set
    aside), never the parser's RecursionError as an internal error."""
    programs = (install._PROBE, launchargs._YAML_PROGRAM, serverargs.SERVER_ARGS_PROBE)
    assert [asked in text for text in programs].count(True) == 1, asked
    python = tmp_path / "python-nesting"
    python.write_text(
        f'#!/bin/sh\ncase "$2" in *"{asked}"*) {NESTED};; esac\nexec {sys.executable} -S "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    more = (*more, str(decode_yaml)) if more == ("--config",) else more
    result = check("--python", str(python), *more, tree_on_path=base)
    assert result.returncode == code, result.stdout + result.stderr
    assert said in result.stdout + result.stderr
    if code != Exit.ENVIRONMENT:
        assert "nested too deeply" in result.stderr or asked == "ServerArgs", result.stderr


def test_a_direct_url_nested_too_deeply_is_read_as_no_url(base: Path, tmp_path: Path):
    """A distribution whose direct_url.json nests deeper than the parser goes: not an
    editable install it can name, so its RECORD is checked (empty here: nothing of the
    tree is vouched for), and the tree is judged by its files."""
    site = tmp_path / "site"
    info = site / f"sglang-{DEFAULT}.dist-info"
    info.mkdir(parents=True)
    (site / "sglang").symlink_to(base / "sglang")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {DEFAULT}\n")
    (info / "RECORD").write_text("")
    (info / "direct_url.json").write_text("[" * 100_000 + "]" * 100_000)
    result = check("--python", sys.executable, tree_on_path=site)
    assert result.returncode in (Exit.AFFECTED, Exit.PARTIAL_FIX), result.stdout + result.stderr
    assert "unpatched sglang" in result.stdout, result.stdout
    assert f"distribution: sglang {DEFAULT} ({info})" in result.stdout, result.stdout
