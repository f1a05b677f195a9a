"""Why our patched functions differ from upstream's fixed release: the notes of notes.toml
(its comment says what a note covers and when it applies)."""

import re
from dataclasses import dataclass
from pathlib import Path

from patchset.errors import BackportError, Exit
from patchset.manifest import Releases, release_key
from patchset.releases import TomlFile


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


NOTES_FILE = Path(__file__).with_name("notes.toml")
RESTORE = "restore it with `git checkout -- scripts/patchreview/notes.toml`"
MATCHERS = ("params", "lines", "blocks", "comments")


def _fits(matcher: str, text: object) -> bool:
    """A parameter's name, or a regular expression that compiles."""
    try:
        if matcher == "params":
            return isinstance(text, str) and text.isidentifier()
        return isinstance(text, str) and re.compile(text) is not None
    except re.error:
        return False


def load_notes(path: Path = NOTES_FILE) -> dict[str, FunctionNotes]:
    """qualname -> its file and notes, as notes.toml holds them, every value checked."""
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


def check_bounds(notes: dict[str, FunctionNotes], registry: Releases) -> None:
    """Refuse a note whose bound is not a release of patches/releases.toml."""
    for qualname, function_notes in notes.items():
        for note in function_notes.notes:
            if unknown := [b for b in (note.since, note.before) if b and b not in registry.known]:
                raise BackportError(
                    Exit.PATCHSET_INVALID,
                    f"{NOTES_FILE}: the note {note.title!r} of {qualname} "
                    f"is bounded by sglang {unknown[0]}, which {registry.path} does not know",
                    "name the release in which upstream made the change, as releases.toml "
                    "spells it",
                )
