"""Print a Review for the terminal, or as one self-contained HTML page."""

from __future__ import annotations

import html
import textwrap

from .notes import Note
from .review import Difference, FunctionComparison, FunctionSource, PatchReview, Review

# --- terminal ------------------------------------------------------------------


def _indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + line if line else "" for line in text.splitlines()]


def _patch_text(patch: PatchReview) -> list[str]:
    from .review import diffstat

    out = [
        f"== {patch.name}",
        f"subject:  {patch.subject}",
        f"upstream: {patch.status}; PR {patch.pr}; released in {patch.release}",
        "why:",
        *_indent(patch.why),
        "touches:",
    ]
    for change in patch.files:
        out.append(f"    {change.path}: {', '.join(change.functions)}")
    out.append("diffstat:")
    out += _indent("\n".join(diffstat(patch.files)))
    return out


def _numbered(function: FunctionComparison) -> dict[Note, int]:
    used: list[Note] = []
    for change in function.signature:
        if change.note and change.note not in used:
            used.append(change.note)
    for diff in function.differences:
        used += [n for n in diff.notes if n not in used]
    return {note: i for i, note in enumerate(used, 1)}


def _refs(notes: list[Note], numbers: dict[Note, int]) -> str:
    return ", ".join(f"[{numbers[n]}]" for n in notes)


def _status_word(diff: Difference, numbers: dict[Note, int]) -> str:
    if not diff.explained:
        return "UNEXPLAINED" + (f" (partly {_refs(diff.notes, numbers)})" if diff.notes else "")
    return f"explained by {_refs(diff.notes, numbers)}" if diff.notes else "layout only"


def _net_change(function: FunctionComparison, base_version: str) -> str:
    touched = ", ".join(p.split("-", 1)[0] for p in function.touched_by) or "no patch"
    if function.changed_by_series:
        return f"changed by the series (touched by {touched})"
    return f"same as in {base_version} after the series (touched by {touched}, net no change)"


def _side(source: FunctionSource, span: tuple[int, int]) -> list[tuple[int, str]]:
    return [(source.first_line + i, source.lines[i]) for i in range(*span)]


def _function_text(function: FunctionComparison, base_version: str) -> list[str]:
    numbers = _numbered(function)
    up = function.upstream_version
    out = [
        f"== {function.qualname}  ({function.path})",
        f"ours: {_net_change(function, base_version)}",
    ]
    if function.signature:
        out.append(f"signature, ours ({base_version} + series) vs {up}:")
        for change in function.signature:
            mine = f"{change.param}: {change.ours}" if change.ours is not None else "(absent)"
            theirs = (
                f"{change.param}: {change.upstream}" if change.upstream is not None else "(absent)"
            )
            ref = f"[{numbers[change.note]}]" if change.note else "UNEXPLAINED"
            out.append(f"    {mine:40} | {theirs:40} {ref}")
    count = len(function.differences)
    unexplained = function.unexplained
    verdict = f"{unexplained} UNEXPLAINED" if unexplained else "all explained"
    out.append(f"{count} differences from {up}, {verdict}:")
    for n, diff in enumerate(function.differences, 1):
        out.append(f"  ({n}) {_status_word(diff, numbers)}")
        for number, text in _side(function.ours, diff.ours):
            out.append(f"      ours {number:5} | {text}")
        for number, text in _side(function.upstream, diff.upstream):
            out.append(f"    {up:>6} {number:5} | {text}")
        for missing in diff.uncovered:
            out.append(
                f"      ? no note covers {missing.side} line {missing.line}: {missing.text.strip()}"
            )
    if numbers:
        out.append("why:")
        for note, number in numbers.items():
            out.append(f"  [{number}] {note.title}  (bases: {note.bases})")
            out += textwrap.wrap(note.why, 76, initial_indent="      ", subsequent_indent="      ")
    for note in function.stale_notes:
        out.append(f"  STALE note (covers no difference any more): {note.title}")
    return out


def render_text(review: Review) -> str:
    out = [
        f"Review of the sglang {review.base_version} backport series "
        f"({len(review.patches)} patches)",
        f"our files:      {review.source}",
        f"compared with:  sglang {review.upstream_version} (pinned wheel, sha256 checked)",
        "",
    ]
    for patch in review.patches:
        out += [*_patch_text(patch), ""]
    out.append(f"== cumulative diff against the pinned base sglang {review.base_version}")
    for path, lines in review.cumulative.items():
        out += lines if lines else [f"{path}: no net change"]
    out.append("")
    for function in review.functions:
        out += [*_function_text(function, review.base_version), ""]
    out.append(_summary(review))
    return "\n".join(out) + "\n"


def _summary(review: Review) -> str:
    return (
        f"summary: {len(review.functions)} functions compared with sglang "
        f"{review.upstream_version}; {review.differences} differences, {review.notes} "
        f"notes about {review.base_version}; {review.unexplained} unexplained "
        f"differences, {review.stale} stale notes"
    )


def summary_line(review: Review) -> str:
    """One line per base, for the table at the end of --all."""
    verdict = "ok" if not (review.unexplained or review.stale) else "NOT OK"
    return (
        f"  {review.base_version:<14} {review.differences:>5} differences  "
        f"{review.notes:>3} notes  {review.unexplained:>3} unexplained  "
        f"{review.stale:>3} stale  {verdict}"
    )


def problems_text(review: Review) -> list[str]:
    """Only what --strict fails on: each uncovered line, parameter and stale note."""
    out: list[str] = []
    for function in review.functions:
        where = f"{review.base_version} {function.qualname}"
        for change in function.signature:
            if change.note is None:
                out.append(f"  {where}: no note covers parameter {change.param}")
        for diff in function.differences:
            for missing in diff.uncovered:
                out.append(
                    f"  {where}: no note covers {missing.side} line {missing.line}: "
                    f"{missing.text.strip()}"
                )
        for note in function.stale_notes:
            out.append(f"  {where}: STALE note (covers nothing here): {note.title}")
    return out


def render_all_text(reviews: list[Review], brief: bool = False) -> str:
    """Every base's review (or with brief, only its problems), then one table."""
    out: list[str] = []
    for review in reviews:
        if brief:
            out += problems_text(review)
        else:
            out += [f"{'#' * 78}", f"# sglang {review.base_version}", f"{'#' * 78}"]
            out.append(render_text(review))
    if reviews:
        out.append(
            f"every base compared with sglang {reviews[0].upstream_version} "
            "(differences and notes counted over the three functions):"
        )
    out += [summary_line(r) for r in reviews]
    return "\n".join(out) + "\n"


# --- HTML ----------------------------------------------------------------------

# identical lines kept around each difference; longer identical runs are folded
FOLD_CONTEXT = 3

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
  margin: 0 auto; max-width: 1500px; padding: 16px 24px 48px; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #d0d7de; }
h3 { font-size: 15px; margin: 0 0 6px; }
h3.fn { font-size: 16px; margin: 28px 0 4px; padding: 6px 10px; background: #f6f8fa;
  border-left: 4px solid #0969da; }
h2 code, h3 code { font-size: inherit; }
.lead { color: #57606a; max-width: 1000px; }
code, pre, td.code { font: 12px/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.meta { color: #57606a; margin: 2px 0; }
.summary { border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 14px; margin: 12px 0;
  background: #f6f8fa; }
.summary.bad { border-color: #cf222e; background: #ffebe9; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 16px; margin: 12px 0; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px;
  font-weight: 600; border: 1px solid; margin-right: 6px; }
.ok { color: #1a7f37; border-color: #1a7f37; background: #dafbe1; }
.bad { color: #a40e26; border-color: #cf222e; background: #ffebe9; }
.neutral { color: #57606a; border-color: #afb8c1; background: #f6f8fa; }
.why p { margin: 6px 0; max-width: 900px; }
pre.stat, pre.diff { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px;
  padding: 8px 10px; overflow-x: auto; margin: 6px 0; }
pre.diff .add { background: #e6ffec; display: block; }
pre.diff .del { background: #ffebe9; display: block; }
pre.diff .hunk { color: #8250df; display: block; }
pre.diff .file { font-weight: 700; display: block; }
table.sbs { width: 100%; border-collapse: collapse; table-layout: fixed; margin: 8px 0;
  border: 1px solid #d0d7de; }
table.sbs col.ln { width: 48px; }
table.sbs th { background: #f6f8fa; text-align: left; padding: 6px 8px; font-weight: 600;
  border-bottom: 1px solid #d0d7de; }
table.sbs td { padding: 0 6px; vertical-align: top; }
td.ln { color: #8c959f; text-align: right; user-select: none; border-right: 1px solid #eaeef2; }
td.code { white-space: pre-wrap; word-break: break-word; }
td.code.mid { border-right: 2px solid #d0d7de; }
tr.changed td.left { background: #ffebe9; }
tr.changed td.right { background: #e6ffec; }
tr.changed td.empty { background: #f6f8fa; }
td.uncovered { outline: 2px solid #cf222e; outline-offset: -2px; }
tr.note td { background: #fff8c5; font: 12px/1.4 system-ui, sans-serif; padding: 3px 8px;
  border-top: 1px solid #d4a72c; }
tr.note.ok td { background: #ddf4ff; border-top-color: #54aeff; }
tr.note.bad td { background: #ffebe9; border-top-color: #cf222e; font-weight: 600; }
tr.fold td { background: #f6f8fa; color: #57606a; text-align: center; font-size: 12px;
  padding: 2px; border-top: 1px dashed #d0d7de; border-bottom: 1px dashed #d0d7de; }
ol.notes li { margin: 4px 0 8px; max-width: 1000px; }
table.sig { border-collapse: collapse; margin: 6px 0; }
table.sig td, table.sig th { border: 1px solid #d0d7de; padding: 2px 8px; text-align: left; }
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _paragraphs(text: str) -> str:
    return "".join(
        f"<p>{_e(' '.join(block.split()))}</p>" for block in text.split("\n\n") if block.strip()
    )


def _patch_html(patch: PatchReview) -> str:
    from .review import diffstat

    status_class = "ok" if patch.status.split(" ")[0] in {"Backport", "Submitted"} else "neutral"
    touched = "".join(
        f"<li><code>{_e(c.path)}</code>: "
        + ", ".join(f"<code>{_e(f)}</code>" for f in c.functions)
        + "</li>"
        for c in patch.files
    )
    return (
        f'<div class="card"><h3>{_e(patch.name)}</h3>'
        f'<div class="meta"><b>{_e(patch.subject)}</b></div>'
        f'<div class="meta"><span class="badge {status_class}">Upstream-Status: '
        f"{_e(patch.status)}</span> PR <code>{_e(patch.pr)}</code> · released in "
        f"sglang <code>{_e(patch.release)}</code></div>"
        f'<div class="why">{_paragraphs(patch.why)}</div>'
        f"<div><b>Touches</b><ul>{touched}</ul></div>"
        f'<pre class="stat">{_e(chr(10).join(diffstat(patch.files)))}</pre></div>'
    )


def _cumulative_html(review: Review) -> str:
    parts: list[str] = []
    for path, lines in review.cumulative.items():
        if not lines:
            parts.append(f'<p class="meta"><code>{_e(path)}</code>: no net change</p>')
            continue
        spans = []
        for line in lines:
            if line.startswith(("--- ", "+++ ")):
                cls = "file"
            elif line.startswith("@@"):
                cls = "hunk"
            elif line.startswith("+"):
                cls = "add"
            elif line.startswith("-"):
                cls = "del"
            else:
                cls = ""
            spans.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line) + "\n")
        parts.append(f'<pre class="diff">{"".join(spans)}</pre>')
    return "".join(parts)


def _code_cells(
    source: FunctionSource, index: int | None, side: str, flagged: set[int], changed: bool
) -> str:
    if index is None:
        mid = " mid" if side == "left" else ""
        return f'<td class="ln {side} empty"></td><td class="code {side} empty{mid}"></td>'
    number = source.first_line + index
    classes = ["code", side]
    if side == "left":
        classes.append("mid")
    if changed and number in flagged:
        classes.append("uncovered")
    return (
        f'<td class="ln {side}">{number}</td>'
        f'<td class="{" ".join(classes)}">{_e(source.lines[index]) or " "}</td>'
    )


def _side_by_side(function: FunctionComparison, base_version: str, numbers: dict[Note, int]) -> str:
    import difflib

    ours, theirs = function.ours, function.upstream
    by_start = {(d.ours[0], d.upstream[0], d.tag): d for d in function.differences}
    rows: list[str] = []
    matcher = difflib.SequenceMatcher(None, ours.lines, theirs.lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            shown = list(zip(range(i1, i2), range(j1, j2), strict=True))
            if len(shown) > 2 * FOLD_CONTEXT + 2:
                head, tail = shown[:FOLD_CONTEXT], shown[-FOLD_CONTEXT:]
                hidden = len(shown) - 2 * FOLD_CONTEXT
                fold = (
                    f'<tr class="fold"><td colspan="4">\u22ef {hidden} identical lines '
                    f"(ours {ours.first_line + head[-1][0] + 1}\u2013"
                    f"{ours.first_line + tail[0][0] - 1}, {_e(function.upstream_version)} "
                    f"{theirs.first_line + head[-1][1] + 1}\u2013"
                    f"{theirs.first_line + tail[0][1] - 1}) \u22ef</td></tr>"
                )
            else:
                head, tail, fold = shown, [], ""
            for part in (head, fold, tail):
                if isinstance(part, str):
                    rows.append(part)
                    continue
                rows += [
                    "<tr>"
                    + _code_cells(ours, i, "left", set(), False)
                    + _code_cells(theirs, j, "right", set(), False)
                    + "</tr>"
                    for i, j in part
                ]
            continue
        diff = by_start[(i1, j1, tag)]
        flagged_ours = {u.line for u in diff.uncovered if u.side == "ours"}
        flagged_up = {u.line for u in diff.uncovered if u.side == "upstream"}
        if diff.explained:
            titles = "; ".join(f"[{numbers[n]}] {n.title}" for n in diff.notes) or "layout only"
            rows.append(f'<tr class="note ok"><td colspan="4">explained: {_e(titles)}</td></tr>')
        else:
            partly = "; ".join(f"[{numbers[n]}] {n.title}" for n in diff.notes)
            rows.append(
                '<tr class="note bad"><td colspan="4">UNEXPLAINED: no note in '
                "notes.py covers the outlined lines"
                + (f" (partly: {_e(partly)})" if partly else "")
                + "</td></tr>"
            )
        for k in range(max(i2 - i1, j2 - j1)):
            i = i1 + k if i1 + k < i2 else None
            j = j1 + k if j1 + k < j2 else None
            rows.append(
                '<tr class="changed">'
                + _code_cells(ours, i, "left", flagged_ours, True)
                + _code_cells(theirs, j, "right", flagged_up, True)
                + "</tr>"
            )
    return (
        '<table class="sbs"><colgroup><col class="ln"><col><col class="ln"><col></colgroup>'
        f'<tr><th colspan="2">ours: sglang {_e(base_version)} + series '
        f'<span class="meta">({_e(ours.path)})</span></th>'
        f'<th colspan="2">upstream: sglang {_e(function.upstream_version)}</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _function_html(function: FunctionComparison, base_version: str, anchor: str) -> str:
    numbers = _numbered(function)
    unexplained = function.unexplained
    badge = (
        f'<span class="badge bad">{unexplained} unexplained</span>'
        if unexplained
        else '<span class="badge ok">all differences explained</span>'
    )
    sig = ""
    if function.signature:
        rows = "".join(
            f"<tr><td><code>{_e(c.param)}</code></td>"
            f"<td><code>{_e(c.ours) if c.ours is not None else '(absent)'}</code></td>"
            f"<td><code>{_e(c.upstream) if c.upstream is not None else '(absent)'}</code></td>"
            + (
                f"<td>[{numbers[c.note]}] {_e(c.note.title)}</td>"
                if c.note
                else '<td><span class="badge bad">UNEXPLAINED</span></td>'
            )
            + "</tr>"
            for c in function.signature
        )
        sig = (
            '<table class="sig"><tr><th>parameter</th><th>ours</th>'
            f"<th>{_e(function.upstream_version)}</th><th>why</th></tr>{rows}</table>"
        )
    notes = "".join(
        f'<li value="{n}"><b>{_e(note.title)}</b> <span class="meta">(bases: '
        f"{_e(note.bases)})</span><br>{_e(note.why)}</li>"
        for note, n in numbers.items()
    )
    stale = "".join(
        f'<p><span class="badge bad">stale note</span>{_e(note.title)}: it covers no '
        "difference any more</p>"
        for note in function.stale_notes
    )
    return (
        f'<h3 id="{_e(anchor)}" class="fn"><code>{_e(function.qualname)}</code></h3>'
        f'<div class="meta"><code>{_e(function.path)}</code> · ours is '
        f"{_e(_net_change(function, base_version))} · {badge}</div>"
        f"{sig}"
        + (f'<ol class="notes">{notes}</ol>' if notes else "")
        + stale
        + _side_by_side(function, base_version, numbers)
    )


def _review_html(review: Review, prefix: str = "") -> str:
    """The body of one base's review; prefix keeps anchors apart on a page of several."""
    bad = review.unexplained or review.stale
    summary_class = "summary bad" if bad else "summary"
    toc = " · ".join(
        f'<a href="#{_e(prefix + f.qualname)}"><code>{_e(f.qualname.rsplit(".", 1)[-1])}</code></a>'
        for f in review.functions
    )
    return (
        f'<div class="{summary_class}">{_e(_summary(review))}<br>'
        f'<span class="meta">our files: {_e(review.source)}<br>upstream: sglang '
        f"{_e(review.upstream_version)}, from its pinned, sha256-checked wheel</span>"
        f"<br>functions: {toc}</div>"
        "<h2>Patches</h2>"
        + "".join(_patch_html(p) for p in review.patches)
        + f"<h2>Cumulative diff against sglang {_e(review.base_version)}</h2>"
        + _cumulative_html(review)
        + f"<h2>Ours beside upstream's fix in sglang {_e(review.upstream_version)}</h2>"
        + '<p class="lead">Each function the series changes, as our patched tree has it '
        "(left) and as upstream's first fixed release has it (right). Every difference "
        "is found by diffing the two; the note above it says why it is there. Outlined "
        "lines are differences no note explains.</p>"
        + "".join(
            _function_html(f, review.base_version, prefix + f.qualname) for f in review.functions
        )
    )


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def render_html(review: Review) -> str:
    return _page(
        f"Review: sglang {review.base_version} backport series",
        f"<h1>sglang {_e(review.base_version)} backport series: review</h1>" + _review_html(review),
    )


def render_all_html(reviews: list[Review]) -> str:
    """Every base's review on one page, a table of the bases first."""
    rows = "".join(
        f'<tr><td><a href="#sglang-{_e(r.base_version)}">{_e(r.base_version)}</a></td>'
        f"<td>{len(r.patches)}</td><td>{r.differences}</td><td>{r.notes}</td>"
        f"<td>{r.unexplained}</td><td>{r.stale}</td>"
        + (
            '<td><span class="badge ok">ok</span></td>'
            if not (r.unexplained or r.stale)
            else '<td><span class="badge bad">not ok</span></td>'
        )
        + "</tr>"
        for r in reviews
    )
    upstream = reviews[0].upstream_version if reviews else ""
    table = (
        '<table class="sig"><tr><th>base</th><th>patches</th><th>differences</th>'
        "<th>notes</th><th>unexplained</th><th>stale</th><th></th></tr>"
        f"{rows}</table>"
    )
    sections = "".join(
        f'<h1 id="sglang-{_e(r.base_version)}">sglang {_e(r.base_version)} backport series</h1>'
        + _review_html(r, prefix=f"{r.base_version}-")
        for r in reviews
    )
    return _page(
        "Review: every backport series",
        f"<h1>Every backport series beside sglang {_e(upstream)}</h1>{table}{sections}",
    )
