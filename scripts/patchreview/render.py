"""Print a Review for the terminal, or as one self-contained HTML page."""

import html
import textwrap
from collections.abc import Container, Iterable
from pathlib import Path

from .review import FileChange, FunctionComparison, FunctionSource, Note, PatchReview, Review

# identical lines kept around each difference (HTML); longer identical runs are folded
FOLD_CONTEXT = 3
# the class of a line of the cumulative diff (HTML), by its first characters
DIFF_CLASSES = (("--- ", "file"), ("+++ ", "file"), ("@@", "hunk"), ("+", "add"), ("-", "del"))

CSS = (Path(__file__).parent / "review.css").read_text(encoding="utf-8")
_e = html.escape


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def diffstat(files: list[FileChange], width: int = 40) -> list[str]:
    name_width = max((len(f.path) for f in files), default=0)
    scale = min(1.0, width / max([1, *(f.added + f.removed for f in files)]))
    lines = []
    for f in files:
        plus = "+" * max(round(f.added * scale), 1 if f.added else 0)
        minus = "-" * max(round(f.removed * scale), 1 if f.removed else 0)
        lines.append(f"{f.path:<{name_width}} | {f.added + f.removed:3} {plus}{minus}")
    added, removed = sum(f.added for f in files), sum(f.removed for f in files)
    lines.append(
        f"{_count(len(files), 'file')} changed, {_count(added, 'insertion')}(+), "
        f"{_count(removed, 'deletion')}(-)"
    )
    return lines


def _numbered(function: FunctionComparison) -> dict[Note, int]:
    """Each note the function's differences cite, numbered in order of first use."""
    cited = [c.note for c in function.signature if c.note]
    cited += [n for diff in function.differences for n in diff.notes]
    return {note: i for i, note in enumerate(dict.fromkeys(cited), 1)}


def _titles(notes: Iterable[Note], numbers: dict[Note, int]) -> str:
    return "; ".join(f"[{numbers[n]}] {n.title}" for n in notes)


def _net_change(function: FunctionComparison, base_version: str) -> str:
    touched = ", ".join(p.split("-", 1)[0] for p in function.touched_by) or "no patch"
    if function.changed_by_series:
        return f"changed by the series (touched by {touched})"
    return f"same as in {base_version} after the series (touched by {touched}, net no change)"


def _summary(review: Review) -> str:
    return (
        f"summary: {len(review.functions)} functions compared with sglang "
        f"{review.upstream_version}; {review.differences} differences, {review.notes} "
        f"notes about {review.base_version}; {review.unexplained} unexplained "
        f"differences, {review.stale} stale notes"
    )


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
            mine, theirs = (
                f"{change.param}: {v}" if v is not None else "(absent)"
                for v in (change.ours, change.upstream)
            )
            ref = f"[{numbers[change.note]}]" if change.note else "UNEXPLAINED"
            out.append(f"    {mine:40} | {theirs:40} {ref}")
    verdict = f"{function.unexplained} UNEXPLAINED" if function.unexplained else "all explained"
    out.append(f"{len(function.differences)} differences from {up}, {verdict}:")
    for n, diff in enumerate(function.differences, 1):
        refs = ", ".join(f"[{numbers[note]}]" for note in diff.notes)
        status = f"explained by {refs}" if refs else "layout only"
        if not diff.explained:
            status = "UNEXPLAINED" + (f" (partly {refs})" if refs else "")
        out.append(f"  ({n}) {status}")
        for side, label, (start, end) in (
            (function.ours, "  ours", diff.ours),
            (function.upstream, f"{up:>6}", diff.upstream),
        ):
            for i in range(start, end):
                out.append(f"    {label} {side.first_line + i:5} | {side.lines[i]}")
        out += [f"      ? {missing}" for missing in diff.uncovered]
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
        out += [
            f"== {patch.name}",
            f"subject:  {patch.subject}",
            f"upstream: {patch.status}; PR {patch.pr}; released in {patch.release}",
            "why:",
            *(f"    {line}" if line else "" for line in patch.why.splitlines()),
            "touches:",
            *(f"    {change.path}: {', '.join(change.functions)}" for change in patch.files),
            "diffstat:",
            *(f"    {line}" for line in diffstat(patch.files)),
            "",
        ]
    out.append(f"== cumulative diff against the pinned base sglang {review.base_version}")
    for path, lines in review.cumulative.items():
        out += lines if lines else [f"{path}: no net change"]
    out.append("")
    for function in review.functions:
        out += [*_function_text(function, review.base_version), ""]
    out.append(_summary(review))
    return "\n".join(out) + "\n"


def render_all_text(reviews: list[Review], brief: bool = False) -> str:
    """Every base's review (with brief, only what --strict fails on), then one table."""
    out: list[str] = []
    for review in reviews:
        if not brief:
            out += ["#" * 78, f"# sglang {review.base_version}", "#" * 78, render_text(review)]
            continue
        for function in review.functions:
            where = f"  {review.base_version} {function.qualname}:"
            sig = [f"no note covers parameter {c.param}" for c in function.signature if not c.note]
            uncovered = [str(u) for diff in function.differences for u in diff.uncovered]
            stale = [f"STALE note (covers nothing here): {n.title}" for n in function.stale_notes]
            out += [f"{where} {problem}" for problem in (*sig, *uncovered, *stale)]
    out.append(
        f"every base compared with sglang {reviews[0].upstream_version} "
        "(differences and notes counted over the three functions):"
    )
    for r in reviews:
        out.append(
            f"  {r.base_version:<14} {r.differences:>5} differences  {r.notes:>3} notes  "
            f"{r.unexplained:>3} unexplained  {r.stale:>3} stale  {'ok' if r.ok else 'NOT OK'}"
        )
    return "\n".join(out) + "\n"


def _badge(cls: str, text: str) -> str:
    return f'<span class="badge {cls}">{text}</span>'


def _code(text: str | None) -> str:
    return f"<code>{_e(text) if text is not None else '(absent)'}</code>"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="sig"><tr>{head}</tr>{body}</table>'


def _patch_html(patch: PatchReview) -> str:
    status_class = "ok" if patch.status.split(" ")[0] in {"Backport", "Submitted"} else "neutral"
    touched = "".join(
        f"<li>{_code(c.path)}: {', '.join(map(_code, c.functions))}</li>" for c in patch.files
    )
    why = "".join(f"<p>{_e(' '.join(b.split()))}</p>" for b in patch.why.split("\n\n") if b.strip())
    return (
        f'<div class="card"><h3>{_e(patch.name)}</h3>'
        f'<div class="meta"><b>{_e(patch.subject)}</b></div>'
        f'<div class="meta">{_badge(status_class, f"Upstream-Status: {_e(patch.status)}")}'
        f" PR {_code(patch.pr)} · released in sglang {_code(patch.release)}</div>"
        f'<div class="why">{why}</div><div><b>Touches</b><ul>{touched}</ul></div>'
        f'<pre class="stat">{_e(chr(10).join(diffstat(patch.files)))}</pre></div>'
    )


def _cumulative_html(review: Review) -> str:
    parts: list[str] = []
    for path, lines in review.cumulative.items():
        if not lines:
            parts.append(f'<p class="meta">{_code(path)}: no net change</p>')
            continue
        spans = []
        for line in lines:
            cls = next((c for prefix, c in DIFF_CLASSES if line.startswith(prefix)), "")
            spans.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line) + "\n")
        parts.append(f'<pre class="diff">{"".join(spans)}</pre>')
    return "".join(parts)


def _cells(source: FunctionSource, i: int | None, side: str, flagged: Container[int] = ()) -> str:
    """A line's number and code; flagged holds the line numbers no note covers."""
    mid = " mid" if side == "left" else ""
    if i is None:
        return f'<td class="ln {side} empty"></td><td class="code {side} empty{mid}"></td>'
    number = source.first_line + i
    uncovered = " uncovered" if number in flagged else ""
    return (
        f'<td class="ln {side}">{number}</td>'
        f'<td class="code {side}{mid}{uncovered}">{_e(source.lines[i]) or " "}</td>'
    )


def _equal_rows(function: FunctionComparison, i1: int, i2: int, j1: int) -> list[str]:
    """Identical lines ours[i1:i2] (upstream's from j1), a long run folded in the middle."""
    ours, theirs = function.ours, function.upstream

    def row(i: int) -> str:
        return f"<tr>{_cells(ours, i, 'left')}{_cells(theirs, j1 + i - i1, 'right')}</tr>"

    if i2 - i1 <= 2 * FOLD_CONTEXT + 2:
        return [row(i) for i in range(i1, i2)]
    first, last = i1 + FOLD_CONTEXT, i2 - FOLD_CONTEXT - 1
    fold = (
        f'<tr class="fold"><td colspan="4">\u22ef {i2 - i1 - 2 * FOLD_CONTEXT} '
        f"identical lines (ours {ours.first_line + first}\u2013{ours.first_line + last}, "
        f"{_e(function.upstream_version)} {theirs.first_line + j1 + first - i1}\u2013"
        f"{theirs.first_line + j1 + last - i1}) \u22ef</td></tr>"
    )
    return [*map(row, range(i1, first)), fold, *map(row, range(last + 1, i2))]


def _side_by_side(function: FunctionComparison, base_version: str, numbers: dict[Note, int]) -> str:
    ours, theirs = function.ours, function.upstream
    rows: list[str] = []
    i = j = 0
    for diff in function.differences:
        (i1, i2), (j1, j2) = diff.ours, diff.upstream
        rows += _equal_rows(function, i, i1, j)
        titles = _e(_titles(diff.notes, numbers))
        cls, text = "ok", f"explained: {titles or 'layout only'}"
        if not diff.explained:
            partly = f" (partly: {titles})" if titles else ""
            text = f"UNEXPLAINED: no note in notes.toml covers the outlined lines{partly}"
            cls = "bad"
        rows.append(f'<tr class="note {cls}"><td colspan="4">{text}</td></tr>')
        mine, up = ({u.line for u in diff.uncovered if u.side == s} for s in ("ours", "upstream"))
        for k in range(max(i2 - i1, j2 - j1)):
            left = _cells(ours, i1 + k if i1 + k < i2 else None, "left", mine)
            right = _cells(theirs, j1 + k if j1 + k < j2 else None, "right", up)
            rows.append(f'<tr class="changed">{left}{right}</tr>')
        i, j = i2, j2
    rows += _equal_rows(function, i, len(ours.lines), j)
    return (
        '<table class="sbs"><colgroup><col class="ln"><col><col class="ln"><col></colgroup>'
        f'<tr><th colspan="2">ours: sglang {_e(base_version)} + series '
        f'<span class="meta">({_e(ours.path)})</span></th>'
        f'<th colspan="2">upstream: sglang {_e(function.upstream_version)}</th></tr>'
        f"{''.join(rows)}</table>"
    )


def _function_html(function: FunctionComparison, base_version: str, anchor: str) -> str:
    numbers = _numbered(function)
    n = function.unexplained
    badge = _badge("bad", f"{n} unexplained") if n else _badge("ok", "all differences explained")
    rows = []
    for c in function.signature:
        why = _e(_titles([c.note], numbers)) if c.note else _badge("bad", "UNEXPLAINED")
        rows.append([_code(c.param), _code(c.ours), _code(c.upstream), why])
    sig = _table(["parameter", "ours", _e(function.upstream_version), "why"], rows) if rows else ""
    notes = "".join(
        f'<li value="{n}"><b>{_e(note.title)}</b> <span class="meta">(bases: '
        f"{_e(note.bases)})</span><br>{_e(note.why)}</li>"
        for note, n in numbers.items()
    )
    stale = "".join(
        f"<p>{_badge('bad', 'stale note')}{_e(note.title)}: it covers no difference any more</p>"
        for note in function.stale_notes
    )
    return (
        f'<h3 id="{_e(anchor)}" class="fn">{_code(function.qualname)}</h3>'
        f'<div class="meta">{_code(function.path)} · ours is '
        f"{_e(_net_change(function, base_version))} · {badge}</div>{sig}"
        + (f'<ol class="notes">{notes}</ol>' if notes else "")
        + stale
        + _side_by_side(function, base_version, numbers)
    )


def _review_html(review: Review, prefix: str = "") -> str:
    """The body of one base's review; prefix keeps anchors apart on a page of several."""
    toc = " · ".join(
        f'<a href="#{_e(prefix + f.qualname)}">{_code(f.qualname.rsplit(".", 1)[-1])}</a>'
        for f in review.functions
    )
    return (
        f'<div class="{"summary" if review.ok else "summary bad"}">{_e(_summary(review))}<br>'
        f'<span class="meta">our files: {_e(review.source)}<br>upstream: sglang '
        f"{_e(review.upstream_version)}, from its pinned, sha256-checked wheel</span>"
        f"<br>functions: {toc}</div><h2>Patches</h2>"
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
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>\n{CSS}</style></head><body>{body}</body></html>\n"
    )


def render_html(review: Review) -> str:
    return _page(
        f"Review: sglang {review.base_version} backport series",
        f"<h1>sglang {_e(review.base_version)} backport series: review</h1>" + _review_html(review),
    )


def render_all_html(reviews: list[Review]) -> str:
    rows = [
        [
            f'<a href="#sglang-{_e(r.base_version)}">{_e(r.base_version)}</a>',
            *map(str, (len(r.patches), r.differences, r.notes, r.unexplained, r.stale)),
            _badge("ok", "ok") if r.ok else _badge("bad", "not ok"),
        ]
        for r in reviews
    ]
    table = _table(["base", "patches", "differences", "notes", "unexplained", "stale", ""], rows)
    upstream = reviews[0].upstream_version if reviews else ""
    sections = "".join(
        f'<h1 id="sglang-{_e(r.base_version)}">sglang {_e(r.base_version)} backport series</h1>'
        + _review_html(r, prefix=f"{r.base_version}-")
        for r in reviews
    )
    return _page(
        "Review: every backport series",
        f"<h1>Every backport series beside sglang {_e(upstream)}</h1>{table}{sections}",
    )
