"""scripts/review: per-patch facts, the net diff, and ours beside sglang 0.5.19.

The comparison with 0.5.19 uses the real, pinned 0.5.19 wheel (conftest's
upstream_fixed_wheel). The explanation logic is also checked on small
synthetic functions, so a difference nobody explained must show up.
"""

from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import RunScript
from patchreview.notes import FUNCTION_NOTES, FunctionNotes, Note
from patchreview.render import render_html, render_text
from patchreview.review import Review, build_review, compare_function, function_source
from patchset.manifest import Series

FUNCTIONS = (
    "FutureMap.publish",
    "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
    "build_eagle_disagg_draft_input",
)
OUR_COMMENT = "get_new_prebuilt_batch() has already made it wait"
STALE_UPSTREAM_COMMENT = "publish's chained record"


@pytest.fixture(scope="session")
def review(series: Series, upstream_fixed_wheel: Path, tmp_path_factory) -> Review:
    # an empty build folder: our files come from the pinned base wheel plus the series
    build = tmp_path_factory.mktemp("build")
    return build_review(series, build, upstream_fixed_wheel.parent)


def without(qualname: str, title_start: str) -> dict[str, FunctionNotes]:
    notes = dict(FUNCTION_NOTES)
    kept = tuple(n for n in notes[qualname].notes if not n.title.startswith(title_start))
    assert len(kept) == len(notes[qualname].notes) - 1, "the note to remove is not there"
    notes[qualname] = dataclasses.replace(notes[qualname], notes=kept)
    return notes


def test_real_series_is_fully_explained(review: Review) -> None:
    assert [f.qualname for f in review.functions] == list(FUNCTIONS)
    assert review.unexplained == 0
    assert review.stale == 0
    assert "pinned wheel" in review.source
    # each function really differs from 0.5.19, so the notes had work to do
    for function in review.functions:
        assert function.differences, function.qualname
        assert all(d.explained for d in function.differences)


def test_signatures_of_the_pinned_base(review: Review) -> None:
    by_name = {f.qualname: f for f in review.functions}
    changes = {
        name: {(c.param, c.ours, c.upstream) for c in f.signature} for name, f in by_name.items()
    }
    assert changes["FutureMap.publish"] == {("confidence", None, "Optional[torch.Tensor] = None")}
    assert changes["SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch"] == {
        ("running_batch", None, "ScheduleBatch")
    }
    assert changes["build_eagle_disagg_draft_input"] == {("server_args", "ServerArgs", None)}


def test_patches_name_their_functions_and_trailers(review: Review) -> None:
    first, second = review.patches
    assert first.status == second.status == "Backport"
    assert (first.pr, first.release) == ("sgl-project/sglang#30435", "0.5.16")
    assert (second.pr, second.release) == ("sgl-project/sglang#35748", "0.5.19")
    assert first.functions == ["FutureMap.publish", "build_eagle_disagg_draft_input"]
    assert set(second.functions) == set(FUNCTIONS)
    assert "A CUDA event only remembers its latest" in first.why
    assert "Upstream-Status" not in first.why
    decode = next(c for c in second.files if c.path.endswith("decode.py"))
    assert (decode.added, decode.removed) == (5, 0)


def test_cumulative_diff_is_against_the_pinned_base(review: Review) -> None:
    diffs = review.cumulative
    assert diffs["python/sglang/srt/managers/overlap_utils.py"] == []  # 0002 undoes 0001 there
    decode = "\n".join(diffs["python/sglang/srt/disaggregation/decode.py"])
    assert "+            self.schedule_stream.wait_stream(self.forward_stream)" in decode
    assert "@@ -1973,6 +1973,11 @@ SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch" in (
        decode
    )
    publish = next(f for f in review.functions if f.qualname == "FutureMap.publish")
    assert not publish.changed_by_series
    assert publish.touched_by == [p.name for p in review.patches]


def test_removing_a_note_leaves_an_unexplained_difference(
    series: Series, upstream_fixed_wheel: Path, tmp_path: Path
) -> None:
    notes = without("build_eagle_disagg_draft_input", "comment corrected")
    broken = build_review(series, tmp_path / "build", upstream_fixed_wheel.parent, notes)
    assert broken.unexplained == 1
    eagle = broken.functions[-1]
    uncovered = [u.text.strip() for d in eagle.differences for u in d.uncovered]
    assert any(STALE_UPSTREAM_COMMENT in text for text in uncovered)
    assert any(OUR_COMMENT in text for text in uncovered)
    text = render_text(broken)
    assert "1 UNEXPLAINED" in text and "1 unexplained differences" in text
    assert "UNEXPLAINED: no note" in render_html(broken)


def test_removing_a_signature_note_flags_the_parameter(
    series: Series, upstream_fixed_wheel: Path, tmp_path: Path
) -> None:
    notes = without("SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch", "0.5.15.post1 sig")
    broken = build_review(series, tmp_path / "build", upstream_fixed_wheel.parent, notes)
    decode = broken.functions[1]
    assert [(c.param, c.note) for c in decode.signature] == [("running_batch", None)]
    assert decode.unexplained >= 1
    assert re.search(r"running_batch: ScheduleBatch\s+UNEXPLAINED", render_text(broken))


OURS = """\
class FutureMap:
    def publish(self, indices, lens):
        self.buf[indices] = lens
        # seed the rows
        self.ready.record()
"""


def _compare(upstream: str, notes: tuple[Note, ...] = ()):
    ours = function_source(OURS, "x.py", "FutureMap.publish")
    theirs = function_source(upstream, "x.py", "FutureMap.publish")
    assert ours and theirs
    return compare_function("FutureMap.publish", ours, theirs, FunctionNotes("x.py", notes), "9.9")


def test_new_upstream_line_without_a_note_is_unexplained() -> None:
    result = _compare(
        OURS.replace(
            "        self.ready.record()\n",
            "        self.ready.record()\n        self.fresh = True\n",
        )
    )
    assert result.unexplained == 1
    assert [(u.side, u.line, u.text.strip()) for d in result.differences for u in d.uncovered] == [
        ("upstream", 6, "self.fresh = True")
    ]
    explained = _compare(
        OURS.replace(
            "        self.ready.record()\n",
            "        self.ready.record()\n        self.fresh = True\n",
        ),
        (Note("fresh flag", "upstream bookkeeping", lines=(r"\bfresh\b",)),),
    )
    assert explained.unexplained == 0


def test_block_and_comment_notes_cover_only_their_lines() -> None:
    upstream = OURS.replace(
        "        # seed the rows\n",
        "        # seed the rows, then relay\n"
        "        if relay:\n"
        "            self.relay(indices)\n"
        "        self.other = 1\n",
    )
    notes = (
        Note("relay", "feature", blocks=(r"^\s*if relay:",)),
        Note("comment", "wording", comments=(r"seed the rows",)),
    )
    result = _compare(upstream, notes)
    uncovered = [u.text.strip() for d in result.differences for u in d.uncovered]
    # the block ends where the indentation does; the next statement needs its own note
    assert uncovered == ["self.other = 1"]


def test_unused_note_is_stale() -> None:
    result = _compare(OURS, (Note("gone", "was true once", lines=(r"no_such_name",)),))
    assert result.differences == []
    assert [n.title for n in result.stale_notes] == ["gone"]


def test_signature_difference_needs_a_note() -> None:
    upstream = OURS.replace(
        "def publish(self, indices, lens):", "def publish(self, indices, lens, extra=None):"
    )
    bare = _compare(upstream)
    assert [(c.param, c.upstream) for c in bare.signature] == [("extra", " = None")]
    assert bare.unexplained == 2  # the parameter, and the def line it changes
    noted = _compare(upstream, (Note("extra", "later feature", params=("extra",)),))
    assert noted.unexplained == 0


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.refs: list[str] = []
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in {"src", "href"} and value:
                self.refs.append(value)
            if name == "id" and value:
                self.ids.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_page_is_self_contained_and_complete(run_script: RunScript, tmp_path: Path) -> None:
    page = tmp_path / "out" / "review.html"
    result = run_script("review", "--strict", "--html", str(page))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {page}" in result.stdout
    source = page.read_text(encoding="utf-8")
    parsed = _Collect()
    parsed.feed(source)
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    assert all(ref.startswith("#") for ref in parsed.refs), parsed.refs
    assert "url(" not in source and "@import" not in source
    assert parsed.ids == list(FUNCTIONS)
    assert source.count('<table class="sbs">') == 3
    text = "".join(parsed.text)
    assert OUR_COMMENT in text and STALE_UPSTREAM_COMMENT in text
    assert "0 unexplained differences, 0 stale notes" in text
    # long identical runs are folded, differences never are
    assert re.search(r"\d+ identical lines \(ours \d+", text)
    # code is escaped, not interpreted as markup
    assert "-&gt; Optional[ScheduleBatch]:" in source


def test_review_reads_the_build_tree_when_there_is_one(run_script: RunScript) -> None:
    applied = run_script("apply-patches")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = run_script("review")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"our files: +build tree .*pristine/0\.5\.15\.post1\.\.", result.stdout)
    assert "0 unexplained differences" in result.stdout


def test_damaged_patch_set_is_refused(
    run_script: RunScript, patch_set: Path, series: Series
) -> None:
    folder = patch_set
    patch = folder / series.patch_names[0]
    patch.write_text(patch.read_text(encoding="utf-8").replace("CUDA event", "CUDA  event"))
    result = run_script("review", "--patch-set", str(folder))
    assert result.returncode == 6
    assert "sha256" in result.stderr and "next step:" in result.stderr
    assert "Traceback" not in result.stderr
