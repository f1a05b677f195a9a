"""scripts/race-check --writers: the static scan of FutureMap writers and its table."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS, SESSION_TREES
from patchset.errors import BackportError, Exit
from patchset.manifest import Series
from racecheck import writers

pytestmark = SESSION_TREES

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
    manifest = dataclasses.replace(series.manifest, raw={"writers": known})
    assert writers.main(tree, manifest) == Exit.RACE
    out = capsys.readouterr().out
    assert "Scheduler.run publish | srt/managers/fake.py:6 | forward_stream" in out
    assert "Scheduler.run stash | srt/managers/fake.py:7 | UNCLASSIFIED" in out
    assert "FAILED: 4 writer(s)" in out


def test_an_entry_without_scenario_or_reason_is_refused(series: Series) -> None:
    raw = {"writers": {"a b c": {"stream": "s", "order": "o"}}}
    with pytest.raises(BackportError, match="needs stream, order, and scenarios or a reason"):
        writers.classification(dataclasses.replace(series.manifest, raw=raw))


@pytest.mark.usefixtures("patched_tree")  # race-check reads the session's build tree
def test_the_patched_tree_has_every_writer_classified(series: Series) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "race-check"), "--writers"], capture_output=True, text=True
    )
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
