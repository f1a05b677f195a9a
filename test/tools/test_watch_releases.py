"""scripts/watch-releases: 0.5.19 to 0.5.23 pass from their cached wheels (judged fixed by
their code shape, as their blob ids say); a copy of 0.5.23 without its wait, or with a
FutureMap writer no manifest classifies, fails naming the function or the writer."""

from __future__ import annotations

import dataclasses
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import SCRIPTS, fetch_or_skip
from patchset import catalog, paths, wheel
from patchset.errors import BackportError, Exit
from patchset.manifest import git_blob_id, load_releases, release_key
from racecheck import writers

REGISTRY = load_releases()
UPSTREAM = [v for v, known in REGISTRY.known.items() if known.wheel is not None]
DECODE = "sglang/srt/disaggregation/decode.py"
WAIT = "            self.schedule_stream.wait_stream(self.forward_stream)\n"
FORK_RELAY = """\
class ForkRelay:
    def seed(self, rows, payload):
        self.future_map.stash(rows, payload)
"""


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    """0.5.19 to 0.5.23 as releases.toml pins them, from the shared cache (fetched once)."""
    pins = {v: REGISTRY.known[v].wheel for v in UPSTREAM}
    return {v: fetch_or_skip(pin, paths.cache_dir()) for v, pin in pins.items() if pin}


def watch(*args: str) -> subprocess.CompletedProcess[str]:
    """watch-releases ARGS, forked from the command server (the start is test_startup's)."""
    result = SERVER.run(SCRIPTS / "watch-releases", list(args))
    assert "Traceback" not in result.stderr, result.stderr
    return result


def rewheel(
    source: Path, dest: Path, edit: tuple[str, str, str] | None, add: dict[str, str]
) -> Path:
    """A copy of the wheel source's sglang/*.py members, all that watch-releases reads of a
    wheel (writers.wheel_sources; the .so and data files, half of 0.5.23's bytes, are left
    out): member edit[0] with edit[1] (found once) made edit[2], and the members of add
    added (stored, not compressed again: a copy is read once)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(dest, "w") as new:
        for member in old.infolist():
            if not (member.filename.startswith("sglang/") and member.filename.endswith(".py")):
                continue
            data = old.read(member)
            if edit and member.filename == edit[0]:
                text = data.decode()
                assert text.count(edit[1]) == 1, f"{edit[1]!r} is not once in {edit[0]}"
                data = text.replace(edit[1], edit[2]).encode()
            new.writestr(member, data, compress_type=zipfile.ZIP_STORED)
        for name, text in add.items():
            new.writestr(name, text)
    return dest


@pytest.fixture(scope="module")
def broken(
    wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """One watch-releases run over two copies of 0.5.23: without its wait, and with a
    FutureMap writer no manifest classifies; (its result, each wheel's verdict by name)."""
    folder = tmp_path_factory.mktemp("broken-wheels")
    no_wait = rewheel(
        wheels["0.5.23"], folder / "no-wait.whl", (DECODE, WAIT, "            pass\n"), {}
    )
    added = {"sglang/srt/managers/fork_relay.py": FORK_RELAY}
    fork = rewheel(wheels["0.5.23"], folder / "fork.whl", None, added)
    result = watch("--wheel", str(no_wait), "--wheel", str(fork))
    verdicts = {
        block.split(":")[0].removeprefix("sglang "): block
        for block in result.stdout.split("\n\n")
        if block.startswith("sglang ")
    }
    assert list(verdicts) == ["no-wait.whl", "fork.whl"], result.stdout + result.stderr
    return result, verdicts


@pytest.fixture(scope="module")
def fixed(wheels: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    """One watch-releases run over 0.5.19 to 0.5.23, each from the cache."""
    assert UPSTREAM == ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    return watch(*(a for v in UPSTREAM for a in ("--release", v)))


def test_the_releases_after_the_fix_pass_from_their_cached_wheels(
    fixed: subprocess.CompletedProcess[str],
) -> None:
    result = fixed
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    for version in UPSTREAM:
        pin = REGISTRY.known[version].wheel
        assert pin is not None
        assert f"sglang {version}: {pin.wheel} sha256 {pin.sha256}\n  fixed: " in result.stdout
    assert result.stdout.count("  ok: judged fixed, every FutureMap writer classified") == 5
    assert "ok: 5 judged fixed, every FutureMap writer classified" in result.stdout


def test_the_releases_after_the_fix_are_judged_fixed_as_their_blob_ids_say(
    wheels: dict[str, Path], fixed: subprocess.CompletedProcess[str]
) -> None:
    """Their code shape (shape.judge on every .py file of the wheel, as the run above
    judged it) and the catalog, by the three files' blob ids, agree: fix B is in."""
    judged = {
        block.split(":")[0].removeprefix("sglang "): block
        for block in fixed.stdout.split("\n\n")
        if block.startswith("sglang ")
    }
    assert list(judged) == UPSTREAM, fixed.stdout + fixed.stderr
    known = catalog.load_catalog(paths.PATCHES_ROOT)
    fix_b = f"sgl-project/sglang#{REGISTRY.fixes['fix-b'].pr}"
    for version, wheel_file in wheels.items():
        files = wheel.read_files(wheel_file, known.files).items()
        found = known.lookup({path: git_blob_id(data) for path, data in files})
        assert found, f"{version}: the files are no release or step the catalog knows"
        assert fix_b in found[0].fixes, version
        assert "\n  fixed: " in judged[version], judged[version]
    # from 0.5.21 the wait is in the helper the entry calls; it is followed there
    text = judged["0.5.21"]
    assert "_get_new_prebuilt_batch: followed from" in text
    assert "_get_new_prebuilt_batch: a full ordering: self.schedule_stream.wait_stream" in text


def test_0_5_23_without_its_wait_fails_naming_the_function(
    broken: tuple[subprocess.CompletedProcess[str], dict[str, str]],
) -> None:
    result, verdicts = broken
    assert result.returncode == Exit.RACE, result.stdout + result.stderr
    assert (
        "  FAILED: judged affected: SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch "
        "reaches process_prebuilt() at srt/disaggregation/decode.py:"
    ) in verdicts["no-wait.whl"]
    assert (
        "FAILED: 2 of 2 not judged fixed with every writer classified: no-wait.whl, fork.whl"
        in result.stdout
    )


def test_a_writer_no_manifest_classifies_fails_naming_it(
    broken: tuple[subprocess.CompletedProcess[str], dict[str, str]],
) -> None:
    result, verdicts = broken
    assert result.returncode == Exit.RACE, result.stdout + result.stderr
    assert "  fixed: every path with overlap on" in verdicts["fork.whl"]
    assert (
        "  FAILED: FutureMap writer ForkRelay.seed (stash) at srt/managers/fork_relay.py:3 is "
        "classified by no manifest (key 'srt/managers/fork_relay.py ForkRelay.seed stash')"
    ) in verdicts["fork.whl"]


def test_every_upstream_writer_entry_names_a_writer_of_a_release_after_the_fix(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """patches/upstream-writers.toml classifies only what the scan finds and no pin.toml does."""
    ours = writers.checked(tomllib.loads(writers.UPSTREAM_WRITERS.read_text())["writers"], "ours")
    found: set[str] = set()
    for version, wheel_file in wheels.items():
        tree = tmp_path / version
        files = {key.split()[0] for key in ours}
        with zipfile.ZipFile(wheel_file) as archive:
            for name in files:
                member = f"sglang/{name}"
                if member in archive.namelist():
                    (tree / "python" / member).parent.mkdir(parents=True, exist_ok=True)
                    (tree / "python" / member).write_bytes(archive.read(member))
        found |= {w.key for w in writers.scan(tree)}
    assert set(ours) <= found
    every = writers.classified()
    served = {k for k in every if k not in ours}
    assert not set(ours) & served


def test_a_damaged_upstream_writers_table_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "upstream-writers.toml"
    table.write_text('[writers]\n"a b c" = { stream = "s", order = "o" }\n')
    monkeypatch.setattr(writers, "UPSTREAM_WRITERS", table)
    with pytest.raises(BackportError) as refused:
        writers.classified()
    assert refused.value.code == Exit.PATCHSET_INVALID
    assert f'{table}: writers."a b c" needs scenarios' in str(refused.value)


@pytest.mark.network
def test_the_releases_newer_than_the_registry_are_listed_from_the_index() -> None:
    known = {v: r for v, r in REGISTRY.known.items() if release_key(v) < release_key("0.5.22")}
    try:
        newer = writers.newer_releases(dataclasses.replace(REGISTRY, known=known))
    except BackportError as err:
        if err.code != Exit.WHEEL_UNAVAILABLE:
            raise
        pytest.skip(f"needs the package index (network): {err.problem}")
    assert newer[:2] == ["0.5.22", "0.5.23"]
    assert newer == sorted(newer, key=release_key)
    assert all(release_key(v) > release_key("0.5.21") for v in newer)
