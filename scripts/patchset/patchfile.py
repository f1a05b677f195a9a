"""Read one `git format-patch` file: its message, trailers and hunks, with line numbers.

Lint and review both need the parts of a patch and where in the patch file
each part sits, so that a problem can be reported as file:line.
"""

from __future__ import annotations

import email.policy
import re
import tempfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from .git import Git
from .lock import marked_folder

TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.*)$")
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
INDEX_LINE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")


@dataclass
class PatchLine:
    """One line of a hunk: its kind ('+', '-', ' '), text, and where it is."""

    kind: str
    text: str
    patch_line: int  # 1-based line in the patch file
    old_line: int | None  # line in the file before the patch ('-' and ' ')
    new_line: int | None  # line in the file after the patch ('+' and ' ')


@dataclass
class Hunk:
    lines: list[PatchLine] = field(default_factory=list)


@dataclass
class FileDiff:
    old_path: str
    new_path: str
    diff_line: int  # line of `diff --git` in the patch file
    old_blob: str | None = None
    new_blob: str | None = None
    index_line: int | None = None
    hunks: list[Hunk] = field(default_factory=list)
    # patch-file lines of "\ No newline at end of file" that follow '+' lines
    new_lacks_final_newline: list[int] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path if self.new_path != "/dev/null" else self.old_path

    @property
    def added(self) -> int:
        return sum(1 for h in self.hunks for line in h.lines if line.kind == "+")

    @property
    def removed(self) -> int:
        return sum(1 for h in self.hunks for line in h.lines if line.kind == "-")


@dataclass
class Trailer:
    key: str
    value: str
    line: int


@dataclass
class Patch:
    """A parsed patch file."""

    path: Path
    text: str
    subject: str | None
    subject_line: int | None
    # message body without the subject and the trailers: the "why"
    body: list[str]
    body_start: int | None
    trailers: list[Trailer]
    files: list[FileDiff]

    def trailer(self, key: str) -> list[Trailer]:
        return [t for t in self.trailers if t.key.lower() == key.lower()]

    @property
    def description(self) -> str:
        return "\n".join(self.body).strip()


def _strip_diff_prefix(path: str) -> str:
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def _split_message(
    lines: list[str], start: int, end: int
) -> tuple[list[str], int | None, list[Trailer]]:
    """Body and trailers of the message lines [start, end) (0-based)."""
    # The trailer block is the last paragraph, if every line of it is Key: value.
    last = end
    while last > start and not lines[last - 1].strip():
        last -= 1
    first = last
    while first > start and lines[first - 1].strip():
        first -= 1
    block = lines[first:last]
    trailers: list[Trailer] = []
    if block and all(TRAILER.match(line) for line in block):
        for offset, line in enumerate(block):
            match = TRAILER.match(line)
            assert match
            trailers.append(Trailer(match[1], match[2].strip(), first + offset + 1))
        body_end = first
    else:
        body_end = last
    while start < body_end and not lines[start].strip():
        start += 1
    body = lines[start:body_end]
    return body, (start + 1 if body else None), trailers


def parse_patch(path: Path) -> Patch:
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()

    # Mail headers end at the first blank line (after the mbox "From " line);
    # the email package unfolds them and decodes RFC 2047 words (=?UTF-8?q?...?=).
    i = 1 if lines and lines[0].startswith("From ") else 0
    header_start = i
    while i < len(lines) and lines[i].strip():
        i += 1
    message_start = i
    headers = HeaderParser(policy=email.policy.default).parsestr(
        "\n".join(lines[header_start:message_start]) + "\n\n"
    )
    raw_subject = headers.get("Subject")
    subject = " ".join(str(raw_subject).split()) if raw_subject is not None else None
    subject_line = next(
        (n + 1 for n in range(header_start, message_start) if lines[n].startswith("Subject:")),
        None,
    )

    # The message ends at the '---' before the diffstat, or at the first diff.
    message_end = len(lines)
    for j in range(message_start, len(lines)):
        if lines[j] == "---" or lines[j].startswith("diff --git "):
            message_end = j
            break
    body, body_start, trailers = _split_message(lines, message_start, message_end)

    files: list[FileDiff] = []
    current: FileDiff | None = None
    hunk: Hunk | None = None
    old_no = new_no = 0
    old_left = new_left = 0
    last_kind = ""
    for j in range(message_end, len(lines)):
        line = lines[j]
        number = j + 1
        if hunk is not None and current is not None and (old_left > 0 or new_left > 0):
            kind = line[:1] if line else " "
            if kind == "+":
                hunk.lines.append(PatchLine("+", line[1:], number, None, new_no))
                new_no += 1
                new_left -= 1
                last_kind = kind
                continue
            if kind == "-":
                hunk.lines.append(PatchLine("-", line[1:], number, old_no, None))
                old_no += 1
                old_left -= 1
                last_kind = kind
                continue
            if kind == " ":
                hunk.lines.append(PatchLine(" ", line[1:], number, old_no, new_no))
                old_no += 1
                new_no += 1
                old_left -= 1
                new_left -= 1
                last_kind = kind
                continue
        if line.startswith("\\") and current is not None:
            if last_kind in "+ " and last_kind:
                current.new_lacks_final_newline.append(number)
            continue
        if line.startswith("diff --git "):
            parts = line.split(" ")
            old, new = (parts[2], parts[3]) if len(parts) >= 4 else ("", "")
            current = FileDiff(_strip_diff_prefix(old), _strip_diff_prefix(new), number)
            files.append(current)
            hunk = None
            continue
        if current is None:
            continue
        index = INDEX_LINE.match(line)
        if index and hunk is None:
            current.old_blob, current.new_blob = index[1], index[2]
            current.index_line = number
            continue
        if line.startswith("--- ") and hunk is None:
            path_ = line[4:].strip()
            current.old_path = "/dev/null" if path_ == "/dev/null" else _strip_diff_prefix(path_)
            continue
        if line.startswith("+++ ") and hunk is None:
            path_ = line[4:].strip()
            current.new_path = "/dev/null" if path_ == "/dev/null" else _strip_diff_prefix(path_)
            continue
        header = HUNK_HEADER.match(line)
        if header:
            old_no, new_no = int(header[1]), int(header[3])
            old_left = int(header[2]) if header[2] is not None else 1
            new_left = int(header[4]) if header[4] is not None else 1
            hunk = Hunk()
            current.hunks.append(hunk)
            last_kind = ""
    return Patch(
        path=path,
        text=text,
        subject=subject,
        subject_line=subject_line,
        body=body,
        body_start=body_start,
        trailers=trailers,
        files=files,
    )


def _git_reading(path: Path, *flags: str) -> tuple[str, str]:
    """What `git apply FLAGS` says of a patch, run in an empty folder; (output, error)."""
    with marked_folder(Path(tempfile.gettempdir()), "sglang-backports-numstat-") as scratch:
        # A missing final newline has a lint rule of its own; git would call it corrupt.
        copy = scratch / "patch"
        data = path.read_bytes()
        copy.write_bytes(data if data.endswith(b"\n") else data + b"\n")
        result = Git(scratch, owned=True).run("apply", *flags, str(copy), check=False)
    if result.returncode != 0:
        return "", result.stderr.strip() or f"git apply exit {result.returncode}"
    return result.stdout, ""


def touched_paths(path: Path) -> tuple[list[str], str]:
    """The files a patch changes as git itself reads it, or ([], why git could not).

    Our parser above follows `diff --git` sections; git also applies a plain
    ---/+++ diff, so the set of touched files is taken from `git apply
    --numstat` (it only reads the patch).
    """
    out, problem = _git_reading(path, "--numstat", "-z")
    if problem:
        return [], problem
    # Records are "added<TAB>deleted<TAB>path" or, for a rename, the same with an
    # empty path followed by the old and the new path as fields of their own.
    fields = iter(out.split("\0"))
    paths: list[str] = []
    for record in fields:
        if not record:
            continue
        name = record.split("\t", 2)[2]
        paths += [name] if name else [next(fields, ""), next(fields, "")]
    return [p for p in paths if p], ""


def file_events(path: Path) -> list[str]:
    """git's summary of what a patch does besides changing lines: create, delete, mode, rename."""
    out, problem = _git_reading(path, "--summary")
    return [line.strip() for line in out.splitlines() if line.strip()] if not problem else []


def line_naming(patch: Patch, file: str) -> int | None:
    """The first diff header line of the patch that names file."""
    for number, line in enumerate(patch.text.split("\n"), 1):
        if line.startswith(("diff --git ", "--- ", "+++ ")) and (
            line.endswith("/" + file) or line.endswith(" " + file)
        ):
            return number
    return None
