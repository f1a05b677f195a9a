"""scripts/race-check --writers: the static scan of FutureMap writers and its table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from command_server import SERVER
from conftest import SCRIPTS, SESSION_TREES
from patchset import paths
from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest, Series, load_releases, patch_set_folders
from patchset.plays import SCENARIOS
from racecheck import writers

SOURCE = """\
from functools import partial


class Scheduler:
    def run(self, batch):
        hook = partial(self.future_map.publish, batch.rows)
        self.future_map.stash(batch.rows, payload)

    def seed(self, fm, rows):
        fm.output_tokens_buf[rows] = 1
        fm.topk_p_buf[rows].copy_(other)
        fm.not_a_relay_buf[rows] = 2
        self.publisher.publish(rows)


def helper(future_map):
    future_map.hidden_states_buf[0][1] += 1
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    module = tmp_path / "python" / "sglang" / "srt" / "managers" / "fake.py"
    module.parent.mkdir(parents=True)
    module.write_text(SOURCE)
    return tmp_path


def test_every_kind_of_writer_is_found_with_its_function_and_line(tree: Path) -> None:
    found = writers.scan(tree)
    assert [(w.line, w.function, w.what) for w in found] == [
        (6, "Scheduler.run", "publish"),
        (7, "Scheduler.run", "stash"),
        (10, "Scheduler.seed", "write output_tokens_buf"),
        (11, "Scheduler.seed", "write topk_p_buf"),
        (17, "helper", "write hidden_states_buf"),
    ]
    assert found[0].key == "srt/managers/fake.py Scheduler.run publish"


def test_an_unclassified_writer_fails_the_scan(
    tree: Path, series: Series, capsys: pytest.CaptureFixture[str]
) -> None:
    known = {
        "srt/managers/fake.py Scheduler.run publish": {
            "stream": "forward_stream",
            "order": "same stream as the forward",
            "scenarios": "S1",
        }
    }
    manifest = dataclasses.replace(series.manifest, writers=known)
    assert writers.main(tree, manifest) == Exit.RACE
    out = capsys.readouterr().out
    assert "Scheduler.run publish | srt/managers/fake.py:6 | forward_stream" in out
    assert "Scheduler.run stash | srt/managers/fake.py:7 | UNCLASSIFIED" in out
    assert "FAILED: 4 writer(s)" in out


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ('{ stream = "s", order = "o" }', "needs scenarios (what plays it) or a reason"),
        ('{ stream = "s", scenarios = "S1" }', ".order is missing"),
        ('{ stream = "s", order = "o", scenario = "S1" }', "has scenario; a row has only"),
    ],
)
def test_a_row_without_its_fields_is_refused(patch_set: Path, row: str, said: str) -> None:
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    pin.write_text(text.replace("[writers]\n", f'[writers]\n"a b c" = {row}\n', 1))
    with pytest.raises(BackportError, match=re.escape(said)) as raised:
        PinManifest.load(pin)
    assert raised.value.code == Exit.PATCHSET_INVALID
    assert f'{pin}: writers."a b c"' in raised.value.problem


@pytest.mark.parametrize("scenarios", ["S1 S99", "every scenario's in-flight forward"])
def test_a_scenario_the_catalogue_does_not_have_is_refused(series: Series, scenarios: str) -> None:
    """A row's scenarios are catalogue names (or "all"); free text cannot be checked."""
    key = "srt/managers/scheduler.py Scheduler.run_batch publish"
    assert series.manifest.writers[key]["scenarios"] == writers.EVERY_SCENARIO
    row = {**series.manifest.writers[key], "scenarios": scenarios}
    damaged = dataclasses.replace(series.manifest, writers={**series.manifest.writers, key: row})
    with pytest.raises(
        BackportError, match=re.escape("not a scenario of scripts/patchset/plays.py")
    ) as raised:
        writers.classification(damaged)
    assert raised.value.code == Exit.PATCHSET_INVALID
    assert f"releases.toml [writers] {key!r}" in raised.value.problem


def test_every_release_classifies_against_the_catalogue() -> None:
    """Each base's merged table: the shared rows and its own, every name a scenario."""
    shared = load_releases().writers
    for folder in patch_set_folders(paths.PATCHES_ROOT):
        manifest = Series.load(folder).manifest
        classes = writers.classification(manifest)
        assert set(shared) <= set(classes) and len(classes) > len(shared), folder.name
        named = {n for row in classes.values() for n in row.get("scenarios", "").split()}
        assert named - {writers.EVERY_SCENARIO} <= set(SCENARIOS), folder.name
        assert "H1" in named and writers.EVERY_SCENARIO in named, folder.name


# the only test here that reads a session tree: the others are this file's own xdist group
@SESSION_TREES
@pytest.mark.usefixtures("patched_tree")  # race-check reads the session's build tree
def test_the_patched_tree_has_every_writer_classified(series: Series) -> None:
    # forked from the command server: an ast scan, not the command's start (test_startup's)
    result = SERVER.run(SCRIPTS / "race-check", ["--writers"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every one classified" in result.stdout
    # The off-forward-stream writers named in issue 12 are each there.
    for writer in (
        "ScheduleBatchDisaggregationDecodeMixin.process_prebuilt stash",
        "SchedulerPPMixin._pp_prep_batch_result stash",
        "Scheduler._build_hisparse_decode_batch stash",
        "build_eagle_disagg_draft_input stash",
    ):
        assert writer in result.stdout
    classes = writers.classification(series.manifest)
    off_stream = [c for c in classes.values() if c["stream"] != "forward_stream"]
    assert all(c.get("scenarios") or c.get("reason") for c in off_stream)
