"""Ours beside upstream's fix: differences found mechanically, their reasons from the notes of
notes.toml (its comment says what a note covers and when it applies; what no note covers is
unexplained, a note that covers nothing is stale)."""

import ast
import difflib
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from patchset import apply, buildtree
from patchset import wheel as wheels
from patchset.catalog import blobs_of
from patchset.errors import BackportError, Exit
from patchset.git import Git
from patchset.manifest import Releases, Series, WheelPin, release_key
from patchset.patchfile import HUNK_HEADER, Patch, parse_patch
from patchset.releases import TomlFile

SIGNIFICANT = re.compile(r"[A-Za-z0-9_]")


@dataclass(frozen=True)
class Note:
    title: str
    why: str
    params: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()
    before: str = ""  # the release where upstream made this change ("" = no bound)
    since: str = ""  # the oldest base this note is about ("" = no bound)

    def applies_to(self, release: str) -> bool:
        key = release_key(release)
        after_since = not self.since or release_key(self.since) <= key
        return after_since and (not self.before or key < release_key(self.before))

    @property
    def bases(self) -> str:
        since = f"{self.since} and later" if self.since else ""
        before = f"older than {self.before}" if self.before else ""
        return ", ".join(filter(None, [since, before])) or "every base"


@dataclass(frozen=True)
class FunctionNotes:
    path: str
    notes: tuple[Note, ...]


Notes = dict[str, FunctionNotes]  # qualname -> its file and notes
NOTES_FILE = Path(__file__).with_name("notes.toml")
RESTORE = "restore it with `git checkout -- scripts/patchreview/notes.toml`"
MATCHERS = ("params", "lines", "blocks", "comments")


def _fits(matcher: str, text: object) -> bool:
    try:
        if matcher == "params":
            return isinstance(text, str) and text.isidentifier()
        return isinstance(text, str) and re.compile(text) is not None
    except re.error:
        return False


def load_notes(path: Path = NOTES_FILE) -> Notes:
    toml = TomlFile.load(path, "the review notes", RESTORE, f"{RESTORE}, or fix it")
    found = {}
    for qualname in toml.table(("functions",)):
        notes = []
        for title in toml.table(("functions", qualname, "notes")):
            keys = ("functions", qualname, "notes", title)
            if unknown := set(toml.table(keys)) - {"why", "since", "before", *MATCHERS}:
                raise toml.refuse((*keys, min(unknown)), "is not a key of a note")
            matchers = {m: tuple(toml.value((*keys, m), list, [])) for m in MATCHERS}
            for m, patterns in matchers.items():
                if bad := [p for p in patterns if not _fits(m, p)]:
                    what = "a parameter's name" if m == "params" else "a regular expression"
                    raise toml.refuse((*keys, m), f"holds {bad[0]!r}, which is not {what}")
            bounds = {b: toml.text((*keys, b), default="") for b in ("since", "before")}
            notes.append(Note(title, toml.text((*keys, "why")), **matchers, **bounds))
        found[qualname] = FunctionNotes(toml.text(("functions", qualname, "path")), tuple(notes))
    return found


def check_bounds(notes: Notes, registry: Releases) -> None:
    for qualname, note in ((q, n) for q, about in notes.items() for n in about.notes):
        if unknown := [b for b in (note.since, note.before) if b and b not in registry.known]:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{NOTES_FILE}: the note {note.title!r} of {qualname} "
                f"is bounded by sglang {unknown[0]}, which {registry.path} does not know",
                "name the release in which upstream made the change, as releases.toml spells it",
            )


def step_files(series: Series, build: Path, cache: Path) -> tuple[list[dict[str, str]], str]:
    """The touched files (text) at every step in order, and where they came from: the build tree
    when it holds exactly this series (each step's blob ids as pinned), else the pinned wheel."""
    manifest = series.manifest
    repo = buildtree.build_tree_path(series, build)
    tag, branch = buildtree.pristine_tag(manifest), buildtree.default_branch(manifest)
    git = Git(repo, owned=True)
    if (repo / ".git").exists() and git.rev(tag) and git.rev(f"refs/heads/{branch}"):
        revs = [tag, *buildtree.series_commits(git, manifest)]
        found = [buildtree.files_at(git, rev, manifest) for rev in revs]
        if [blobs_of(files) for files in found] == [manifest.blobs_at(s) for s in manifest.steps]:
            return [*map(_decoded, found)], f"build tree {repo} ({tag}..{branch})"
    wheel = wheels.fetch_wheel(manifest.base, cache)
    per_step = apply.files_per_step(series, wheels.read_files(wheel, manifest.files)).values()
    return [*map(_decoded, per_step)], f"pinned wheel {manifest.base.wheel} with the series applied"


def _decoded(files: dict[str, bytes | None]) -> dict[str, str]:
    return {path: data.decode("utf-8") for path, data in files.items() if data is not None}


class Scope(NamedTuple):
    qualname: str
    start: int  # first line, decorators included
    end: int
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@functools.lru_cache(maxsize=128)
def scopes_of(source: str) -> tuple[Scope, ...]:
    """Every def and class with its qualified name, outermost first (cached: bases share texts)."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[Scope]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{node.name}"
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                yield Scope(name, start, node.end_lineno or node.lineno, node)
                yield from walk(node.body, f"{name}.")

    return tuple(walk(ast.parse(source).body, ""))


def enclosing(scopes: tuple[Scope, ...], line: int) -> str:
    inner = [s for s in scopes if s.start <= line <= s.end]
    return max(inner, key=lambda s: s.start).qualname if inner else "(module level)"


class FunctionSource(NamedTuple):
    path: str
    first_line: int
    lines: list[str]  # dedented, without line ends
    header_lines: int  # how many of lines are decorators and the def signature
    params: dict[str, str]  # name -> "annotation = default", as ast prints them


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    pairs = [*zip(positional, defaults + args.defaults, strict=True)]
    pairs += zip(args.kwonlyargs, args.kw_defaults, strict=True)
    pairs += [(arg, None) for arg in (args.vararg, args.kwarg) if arg]
    out: dict[str, str] = {}
    for arg, default in pairs:
        shown = ast.unparse(arg.annotation) if arg.annotation else ""
        out[arg.arg] = shown + (f" = {ast.unparse(default)}" if default is not None else "")
    return out


def function_source(source: str, path: str, qualname: str) -> FunctionSource | None:
    scope = next((s for s in scopes_of(source) if s.qualname == qualname), None)
    if scope is None or not isinstance(node := scope.node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    indent = node.col_offset
    lines = [
        line[indent:].rstrip() if line[:indent].strip() == "" else line
        for line in source.splitlines()[scope.start - 1 : scope.end]
    ]
    header_lines = node.body[0].lineno - scope.start
    return FunctionSource(path, scope.start, lines, header_lines, _params(node))


class FileChange(NamedTuple):
    path: str
    added: int
    removed: int
    functions: list[str]


class PatchReview(NamedTuple):
    name: str
    subject: str
    why: str
    status: str
    pr: str
    release: str
    files: list[FileChange]

    @property
    def functions(self) -> list[str]:
        return [f for change in self.files for f in change.functions]


def review_patch(patch: Patch, before: dict[str, str], after: dict[str, str]) -> PatchReview:
    changes: list[FileChange] = []
    for diff in patch.files:
        old, new = (scopes_of(f[diff.path]) if diff.path in f else () for f in (before, after))
        touched: dict[str, None] = {}
        for line in (line for hunk in diff.hunks for line in hunk):
            if line.kind == "+" and line.new_line is not None:
                touched[enclosing(new, line.new_line)] = None
            elif line.kind == "-" and line.old_line is not None:
                touched[enclosing(old, line.old_line)] = None
        changes.append(FileChange(diff.path, diff.added, diff.removed, list(touched)))

    trailers = [patch.trailer(f"Upstream-{key}") for key in ("Status", "PR", "Release")]
    status, pr, release = (found[0].value if found else "(missing)" for found in trailers)
    subject = patch.subject or "(no subject)"
    return PatchReview(patch.path.name, subject, patch.description, status, pr, release, changes)


def cumulative_diff(base: dict[str, str], final: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path, before in base.items():
        scopes = scopes_of(final[path])
        diff = difflib.unified_diff(
            before.splitlines(), final[path].splitlines(), f"a/{path}", f"b/{path}", lineterm=""
        )
        out[path] = []
        for line in diff:
            header = HUNK_HEADER.match(line)
            # name the function the hunk starts in, as git diff does
            out[path].append(f"{line} {enclosing(scopes, int(header[3]) + 3)}" if header else line)
    return out


class Uncovered(NamedTuple):
    side: str  # "ours" or "upstream"
    line: int  # line number in that side's file
    text: str

    def __str__(self) -> str:
        return f"no note covers {self.side} line {self.line}: {self.text.strip()}"


@dataclass
class Difference:  # one difflib opcode that is not 'equal', with what explains it
    ours: tuple[int, int]  # [start, end) into FunctionSource.lines
    upstream: tuple[int, int]
    notes: dict[Note, None] = field(default_factory=dict)  # cited, in order of first use
    uncovered: list[Uncovered] = field(default_factory=list)

    @property
    def explained(self) -> bool:
        return not self.uncovered


class SignatureChange(NamedTuple):
    param: str
    ours: str | None  # None: not a parameter on that side
    upstream: str | None
    note: Note | None


@dataclass
class FunctionComparison:
    qualname: str
    path: str
    ours: FunctionSource
    upstream: FunctionSource
    changed_by_series: bool  # ours differs from the base's (no base: new)
    upstream_version: str
    touched_by: list[str]
    signature: list[SignatureChange]
    differences: list[Difference]
    stale_notes: list[Note]
    notes: list[Note] = field(default_factory=list)  # the notes about this base

    @property
    def unexplained(self) -> int:
        notes = [s.note for s in self.signature]
        return sum(not d.explained for d in self.differences) + notes.count(None)


def _covered_lines(lines: list[str], changed: range, note: Note) -> set[int]:
    covered: set[int] = set()
    for i in changed:
        text = lines[i]
        if any(re.search(p, text) for p in (*note.lines, *note.blocks)):
            covered.add(i)
        if any(re.search(p, text) for p in note.blocks):
            # the block's body: the deeper-indented (or blank) lines that follow
            depth = len(text) - len(text.lstrip())
            for j in range(i + 1, changed.stop):
                if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) <= depth:
                    break
                covered.add(j)
        if text.lstrip().startswith("#") and any(re.search(p, text) for p in note.comments):
            for step in (-1, 1):
                j = i
                while j in changed and lines[j].lstrip().startswith("#"):
                    covered.add(j)
                    j += step
    return covered


def compare_function(
    qualname: str,
    ours: FunctionSource,
    upstream: FunctionSource,
    notes: FunctionNotes,
    upstream_version: str,
    base: FunctionSource | None = None,
    touched_by: list[str] | None = None,
    release: str | None = None,
) -> FunctionComparison:
    """Ours beside upstream, explained by the notes about release (None: every note)."""
    about = [n for n in notes.notes if release is None or n.applies_to(release)]
    signature: list[SignatureChange] = []
    for name in {**ours.params, **upstream.params}:
        if (mine := ours.params.get(name)) != (theirs := upstream.params.get(name)):
            note = next((n for n in about if name in n.params), None)
            signature.append(SignatureChange(name, mine, theirs, note))
    signature_notes = [s.note for s in signature if s.note is not None]
    matcher = difflib.SequenceMatcher(None, ours.lines, upstream.lines, autojunk=False)
    differences: list[Difference] = []
    for _, i1, i2, j1, j2 in (op for op in matcher.get_opcodes() if op[0] != "equal"):
        diff = Difference((i1, i2), (j1, j2))
        for side, src, span in ("ours", ours, range(i1, i2)), ("upstream", upstream, range(j1, j2)):
            covered: set[int] = set()
            for note in about:
                if hit := _covered_lines(src.lines, span, note):
                    covered |= hit
                    diff.notes[note] = None
            for i in span:
                text = src.lines[i]
                if i in covered or not SIGNIFICANT.search(text):
                    continue
                if i < src.header_lines and all(s.note for s in signature):
                    # a signature line: ast compared the parameters above
                    diff.notes.update(dict.fromkeys(signature_notes))
                    continue
                diff.uncovered.append(Uncovered(side, src.first_line + i, text))
        differences.append(diff)
    used = {*signature_notes, *(note for d in differences for note in d.notes)}
    return FunctionComparison(
        qualname=qualname,
        path=notes.path,
        ours=ours,
        upstream=upstream,
        changed_by_series=base is None or base.lines != ours.lines,
        upstream_version=upstream_version,
        touched_by=touched_by or [],
        signature=signature,
        differences=differences,
        stale_notes=[n for n in about if n not in used],
        notes=about,
    )


@dataclass
class Review:
    base_version: str
    upstream_version: str
    source: str
    patches: list[PatchReview]
    cumulative: dict[str, list[str]]
    functions: list[FunctionComparison]

    def __post_init__(self) -> None:
        self.unexplained = sum(f.unexplained for f in self.functions)
        self.stale = sum(len(f.stale_notes) for f in self.functions)
        self.differences = sum(len(f.differences) for f in self.functions)  # changed stretches
        self.notes = sum(len(f.notes) for f in self.functions)  # how many are about this base
        self.ok = not (self.unexplained or self.stale)


@functools.cache
def _upstream_sources(pin: WheelPin, cache: Path, paths: tuple[str, ...]) -> dict[str, str]:
    """The files of upstream's fixed release; read once per process (every base shares it)."""
    return _decoded(wheels.read_files(wheels.fetch_wheel(pin, cache), list(paths)))


def build_review(series: Series, build: Path, cache: Path, notes: Notes | None = None) -> Review:
    series.verify()
    notes = load_notes() if notes is None else notes
    manifest = series.manifest
    upstream, release = manifest.registry.upstream_fixed.version, manifest.base.version
    check_bounds(notes, manifest.registry)
    steps, source = step_files(series, build, cache)
    base, final = steps[0], steps[-1]
    patches = [
        review_patch(parse_patch(path), steps[i], steps[i + 1])
        for i, path in enumerate(series.patch_paths)
    ]
    paths = tuple(sorted({n.path for n in notes.values()}))
    upstream_files = _upstream_sources(manifest.registry.upstream_fixed, cache, paths)
    functions: list[FunctionComparison] = []
    for qualname, about in notes.items():
        path = about.path
        ours = function_source(final[path], path, qualname)
        theirs = function_source(upstream_files[path], path, qualname)
        if ours is None or theirs is None:
            where = "our patched tree" if ours is None else f"sglang {upstream}"
            raise BackportError(
                Exit.INTERNAL,
                f"{qualname} is not in {path} of {where}",
                "update scripts/patchreview/notes.toml to the functions the series changes",
            )
        was = function_source(base[path], path, qualname)
        touched_by = [p.name for p in patches if qualname in p.functions]
        functions.append(
            compare_function(qualname, ours, theirs, about, upstream, was, touched_by, release)
        )
    return Review(release, upstream, source, patches, cumulative_diff(base, final), functions)
