"""scripts/review: per-patch facts, the net diff, and ours beside sglang 0.5.19.

The comparison with 0.5.19 uses the real, pinned 0.5.19 wheel (conftest's
upstream_fixed_wheel), for every base we serve. The explanation logic is also
checked on small synthetic functions, so a difference nobody explained must
show up, and a note about other releases must not explain it.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import RunScript, SlimSet, fetch_or_skip
from patchreview import review as review_module
from patchreview.render import render_html, render_text
from patchreview.review import (
    FunctionNotes,
    Note,
    Review,
    build_review,
    compare_function,
    function_source,
    load_notes,
)
from patchset import paths
from patchset.errors import BackportError, Exit
from patchset.manifest import Series, load_releases, patch_set_folders, release_key

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


ALL_SERIES = [Series.load(folder) for folder in patch_set_folders(paths.PATCHES_ROOT)]
BASES = [s.manifest.base.version for s in ALL_SERIES]


@pytest.fixture(scope="session")
def reviews(upstream_fixed_wheel: Path, tmp_path_factory) -> dict[str, Review]:
    """Every base's review, from its pinned wheel plus its series (fetched once, cached)."""
    cache = upstream_fixed_wheel.parent
    for one in ALL_SERIES:
        fetch_or_skip(one.manifest.base, cache)
    build = tmp_path_factory.mktemp("build-all")
    return {s.manifest.base.version: build_review(s, build, cache) for s in ALL_SERIES}


def without(qualname: str, title_start: str) -> dict[str, FunctionNotes]:
    return rescoped(qualname, title_start, None)


def rescoped(
    qualname: str, title_start: str, bases: tuple[str, str] | None
) -> dict[str, FunctionNotes]:
    """The real notes with one note dropped (bases None) or moved to other bases
    (since, before)."""
    notes = load_notes()
    found = [n for n in notes[qualname].notes if n.title.startswith(title_start)]
    assert len(found) == 1, "the note to change is not there"
    kept = [n for n in notes[qualname].notes if n is not found[0]]
    if bases is not None:
        kept.append(dataclasses.replace(found[0], since=bases[0], before=bases[1]))
    notes[qualname] = dataclasses.replace(notes[qualname], notes=tuple(kept))
    return notes


def test_every_patch_set_is_reviewed() -> None:
    assert len(BASES) >= 7 and "0.5.15.post1" in BASES


@pytest.mark.parametrize("base", BASES)
def test_every_base_is_fully_explained(reviews: dict[str, Review], base: str) -> None:
    review = reviews[base]
    problems = [
        f"{f.qualname}: {u.side} {u.line}: {u.text.strip()}"
        for f in review.functions
        for d in f.differences
        for u in d.uncovered
    ] + [f"{f.qualname}: stale {n.title}" for f in review.functions for n in f.stale_notes]
    assert (review.unexplained, review.stale) == (0, 0), problems
    assert [f.qualname for f in review.functions] == list(FUNCTIONS)
    # our series is not upstream's code, so every base has differences to explain
    assert review.differences > 0 and review.notes > 0
    for function in review.functions:
        assert all(n.applies_to(base) for n in function.notes)


def test_note_bounds_are_known_releases() -> None:
    known = load_releases().known
    for function in load_notes().values():
        for note in function.notes:
            for bound in (note.since, note.before):
                assert not bound or bound in known, (note.title, bound)
            if note.since and note.before:
                assert release_key(note.since) < release_key(note.before), note.title
            # a note about no base we serve would never be checked
            assert any(note.applies_to(base) for base in BASES), note.title


NOTE = '[functions.f]\npath = "x.py"\n[functions.f.notes.t]\nwhy = "w"\n'


def test_the_notes_file_reads_back_as_notes(tmp_path: Path) -> None:
    (tmp_path / "n.toml").write_text(NOTE + "lines = ['\\bx\\b']\nbefore = \"0.5.16\"\n")
    note = Note("t", "w", lines=(r"\bx\b",), before="0.5.16")
    assert load_notes(tmp_path / "n.toml") == {"f": FunctionNotes("x.py", (note,))}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (NOTE + "line = ['x']\n", "functions.f.notes.t.line is not a key of a note"),
        (NOTE + "lines = ['(x']\n", "functions.f.notes.t.lines holds '(x', which is not a regular"),
        (NOTE + "params = [1]\n", "functions.f.notes.t.params holds 1, which is not a parameter's"),
        (NOTE.replace('why = "w"', "why = 1"), "functions.f.notes.t.why is an integer, not a"),
        ("[functions.f.notes.t]\nwhy = 'w'\n", "functions.f.path is missing"),
        ("functions = 1\n", "functions is an integer, not a table"),
        ("[functions\n", "is not valid TOML"),
    ],
    ids=["unknown-key", "bad-regex", "bad-param", "why-not-text", "no-path", "no-table", "bad"],
)
def test_a_damaged_notes_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, said: str
) -> None:
    (tmp_path / "n.toml").write_text(text)
    with pytest.raises(BackportError) as refused:
        load_notes(tmp_path / "n.toml")
    assert refused.value.code == Exit.PATCHSET_INVALID and said in str(refused.value)


def test_publish_of_later_bases_is_upstreams(reviews: dict[str, Review]) -> None:
    # 0.5.16 and later carry fix A and the confidence relay, and fix B takes the
    # chain out again: there our publish is 0.5.19's, line for line
    for base in BASES:
        publish = reviews[base].functions[0]
        expected = release_key(base) >= release_key("0.5.16")
        assert (publish.ours.lines == publish.upstream.lines) is expected, base


def test_note_about_other_releases_explains_nothing(
    reviews: dict[str, Review], tmp_path: Path
) -> None:
    # 0.5.13 still builds the extend range from fill_len; the note saying so is
    # moved to 0.5.15 only, where there is no such difference
    oldest = next(s for s in ALL_SERIES if s.manifest.base.version == "0.5.13")
    newer = next(s for s in ALL_SERIES if s.manifest.base.version == "0.5.15")
    notes = rescoped(
        "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
        "extend range",
        ("0.5.15", "0.5.15.post1"),
    )
    old, new = (
        build_review(s, tmp_path / "build", paths.cache_dir(), notes) for s in (oldest, newer)
    )
    uncovered = [u.text.strip() for f in old.functions for d in f.differences for u in d.uncovered]
    assert any("set_extend_input_len" in text for text in uncovered), uncovered
    assert old.unexplained >= 1 and old.stale == 0
    # on the base it now names, it covers nothing: stale there
    assert (new.unexplained, new.stale) == (0, 1)
    decode = new.functions[1]
    assert [n.title for n in decode.stale_notes] == [
        "extend range: set_extend_range() arrived in 0.5.15"
    ]


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
    notes = without("SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch", "base signature")
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


def _compare(upstream: str, notes: tuple[Note, ...] = (), release: str | None = None):
    ours = function_source(OURS, "x.py", "FutureMap.publish")
    theirs = function_source(upstream, "x.py", "FutureMap.publish")
    assert ours and theirs
    return compare_function(
        "FutureMap.publish",
        ours,
        theirs,
        FunctionNotes("x.py", notes),
        "9.9",
        release=release,
    )


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


def test_a_note_bounded_by_an_unknown_release_is_refused(
    series: Series, upstream_fixed_wheel: Path, tmp_path: Path
) -> None:
    notes = rescoped("build_eagle_disagg_draft_input", "comment corrected", ("", "0.5.61"))
    with pytest.raises(BackportError, match=r"bounded by sglang 0\.5\.61, which .*releases\.toml"):
        build_review(series, tmp_path / "build", upstream_fixed_wheel.parent, notes)


def test_note_covers_only_the_releases_it_names() -> None:
    upstream = OURS.replace(
        "        self.ready.record()\n",
        "        self.ready.record()\n        self.fresh = True\n",
    )
    note = Note("fresh flag", "arrived in 0.5.16", lines=(r"\bfresh\b",), before="0.5.16")
    assert _compare(upstream, (note,), release="0.5.15.post1").unexplained == 0
    assert _compare(upstream, (note,), release="0.5.13").unexplained == 0
    later = _compare(upstream, (note,), release="0.5.16")
    assert later.unexplained == 1 and later.notes == []
    # where a note is not about the base, covering nothing does not make it stale
    assert _compare(OURS, (note,), release="0.5.16").stale_notes == []
    assert _compare(OURS, (note,), release="0.5.15").stale_notes == [note]
    bounded = Note("x", "y", since="0.5.13.post1", before="0.5.15.post1")
    releases = ("0.5.13", "0.5.13.post1", "0.5.15", "0.5.15.post1")
    assert [bounded.applies_to(r) for r in releases] == [False, True, True, False]


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


def test_html_page_is_self_contained_and_complete(forked_script: RunScript, tmp_path: Path) -> None:
    page = tmp_path / "out" / "review.html"
    result = forked_script("review", "--strict", "--html", str(page))
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


def test_review_reads_the_build_tree_when_there_is_one(
    forked_script: RunScript, slim_set: SlimSet
) -> None:
    """On a build tree of the three files the series touches (the whole layout is
    test_apply_patches')."""
    where = ("--patch-set", str(slim_set.folder))
    applied = forked_script("apply-patches", *where, env=slim_set.env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = forked_script("review", *where, env=slim_set.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"our files: +build tree .*pristine/0\.5\.15\.post1\.\.", result.stdout)
    assert "0 unexplained differences" in result.stdout


def test_damaged_patch_set_is_refused(
    forked_script: RunScript, patch_set: Path, series: Series
) -> None:
    folder = patch_set
    patch = folder / series.patch_names[0]
    patch.write_text(patch.read_text(encoding="utf-8").replace("CUDA event", "CUDA  event"))
    result = forked_script("review", "--patch-set", str(folder))
    assert result.returncode == 6
    assert "sha256" in result.stderr and "next step:" in result.stderr
    assert "Traceback" not in result.stderr


def _review_command():
    """scripts/review's command module, so a test can run its main() with other notes."""
    return importlib.import_module("commands.review")


def test_new_difference_on_one_base_fails_all_strict(
    reviews: dict[str, Review],
    upstream_fixed_wheel: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the corrected-comment note no longer speaks for the newest base: there the
    # comment is a difference nobody explained, and --all --strict must fail on it
    newest = BASES[-1]
    notes = rescoped("build_eagle_disagg_draft_input", "comment corrected", ("", newest))
    monkeypatch.setattr(review_module, "load_notes", lambda: notes)
    monkeypatch.setenv("SGLANG_BACKPORTS_BUILD", str(tmp_path / "build"))
    monkeypatch.setenv("SGLANG_BACKPORTS_CACHE", str(upstream_fixed_wheel.parent))
    monkeypatch.setattr(sys, "argv", ["review", "--all", "--strict", "--brief"])
    assert _review_command().main() == Exit.STALE
    out, err = capsys.readouterr()
    table = {line.split()[0]: line for line in out.splitlines() if " differences " in line}
    assert list(table) == BASES
    assert [b for b, line in table.items() if line.endswith("NOT OK")] == [newest]
    assert f"{newest} build_eagle_disagg_draft_input: no note covers ours line" in out
    assert f"base {newest})" in err and "next step:" in err


def test_all_bases_in_one_call(forked_script: RunScript, reviews: dict, tmp_path: Path) -> None:
    page = tmp_path / "all.html"
    result = forked_script("review", "--all", "--strict", "--brief", "--html", str(page))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if " differences " in line]
    assert [row[0] for row in rows] == BASES
    assert all(row[-1] == "ok" for row in rows)
    assert "no note covers" not in result.stdout  # --brief: only problems and the table
    source = page.read_text(encoding="utf-8")
    parsed = _Collect()
    parsed.feed(source)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert all(ref.startswith("#") for ref in parsed.refs), parsed.refs
    assert len(parsed.ids) == len(set(parsed.ids))  # anchors stay apart per base
    assert [i for i in parsed.ids if i.startswith("sglang-")] == [f"sglang-{b}" for b in BASES]
    assert all(ref[1:] in parsed.ids for ref in parsed.refs)
    assert source.count('<table class="sbs">') == len(FUNCTIONS) * len(BASES)


def test_all_and_patch_set_together_are_refused(forked_script: RunScript, series: Series) -> None:
    # even the default folder, named on purpose
    result = forked_script("review", "--all", "--patch-set", str(series.folder))
    assert result.returncode == 2
    assert "leave out --patch-set" in result.stderr and "Traceback" not in result.stderr
