"""A `git format-patch` file's message, trailers and hunks, each line numbered for file:line."""

import email.policy
import re
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from .git import Git

TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.*)$")
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
INDEX_LINE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")


@dataclass
class PatchLine:
    kind: str  # '+', '-' or ' '
    text: str
    patch_line: int  # 1-based line in the patch file
    old_line: int | None  # line in the file before the patch ('-' and ' ')
    new_line: int | None  # line in the file after the patch ('+' and ' ')


@dataclass
class FileDiff:
    old_path: str
    new_path: str
    old_blob: str | None = None
    new_blob: str | None = None
    index_line: int | None = None
    hunks: list[list[PatchLine]] = field(default_factory=list)
    # patch-file lines of "\ No newline at end of file" that follow '+' lines
    new_lacks_final_newline: list[int] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path if self.new_path != "/dev/null" else self.old_path

    @property
    def added(self) -> int:
        return sum(1 for h in self.hunks for line in h if line.kind == "+")

    @property
    def removed(self) -> int:
        return sum(1 for h in self.hunks for line in h if line.kind == "-")


@dataclass
class Trailer:
    key: str
    value: str
    line: int


@dataclass
class Patch:
    path: Path
    text: str
    subject: str | None
    subject_line: int | None
    description: str  # the message without the subject and the trailers: the "why"
    trailers: list[Trailer]
    files: list[FileDiff]

    def trailer(self, key: str) -> list[Trailer]:
        return [t for t in self.trailers if t.key.lower() == key.lower()]


def _strip_diff_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_patch(path: Path) -> Patch:
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.removesuffix("\n").split("\n") if text else []
    # Mail headers end at the first blank line (after the mbox "From " line);
    # the email package unfolds them and decodes RFC 2047 words (=?UTF-8?q?...?=).
    header_start = 1 if lines and lines[0].startswith("From ") else 0
    start = next((n for n in range(header_start, len(lines)) if not lines[n].strip()), len(lines))
    header = "\n".join(lines[header_start:start]) + "\n\n"
    raw_subject = HeaderParser(policy=email.policy.default).parsestr(header).get("Subject")
    subject = " ".join(str(raw_subject).split()) if raw_subject is not None else None
    subject_lines = (n + 1 for n in range(header_start, start) if lines[n].startswith("Subject:"))
    # The message ends at the '---' before the diffstat, or at the first diff.
    end = start
    while end < len(lines) and lines[end] != "---" and not lines[end].startswith("diff --git "):
        end += 1
    # The trailer block is the message's last paragraph, if every line of it is Key: value.
    last = end
    while last > start and not lines[last - 1].strip():
        last -= 1
    first = last
    while first > start and lines[first - 1].strip():
        first -= 1
    found = [TRAILER.match(line) for line in lines[first:last]]
    if not found or not all(found):
        first, found = last, []
    trailers = [Trailer(m[1], m[2].strip(), first + n + 1) for n, m in enumerate(found) if m]
    description = "\n".join(lines[start:first]).strip()
    files = _file_diffs(lines, end)
    return Patch(path, text, subject, next(subject_lines, None), description, trailers, files)


def _file_diffs(lines: list[str], start: int) -> list[FileDiff]:
    files: list[FileDiff] = []
    hunk: list[PatchLine] | None = None
    old_no = new_no = old_left = new_left = 0
    for number, line in enumerate(lines[start:], start + 1):
        kind = line[:1] or " "
        if hunk is not None and (old_left > 0 or new_left > 0) and kind in "+- ":
            old = None if kind == "+" else old_no
            new = None if kind == "-" else new_no
            hunk.append(PatchLine(kind, line[1:], number, old, new))
            old_no, old_left = old_no + (old is not None), old_left - (old is not None)
            new_no, new_left = new_no + (new is not None), new_left - (new is not None)
        elif line.startswith("diff --git "):
            parts = line.split(" ")
            names = [_strip_diff_prefix(p) for p in parts[2:4]] if len(parts) >= 4 else ["", ""]
            files.append(FileDiff(*names))
            hunk = None
        elif not files:
            continue
        elif line.startswith("\\"):
            if hunk and hunk[-1].kind in "+ ":
                files[-1].new_lacks_final_newline.append(number)
        elif hunk is None and (index := INDEX_LINE.match(line)):
            files[-1].old_blob, files[-1].new_blob = index[1], index[2]
            files[-1].index_line = number
        elif hunk is None and line.startswith("--- "):
            files[-1].old_path = _strip_diff_prefix(line[4:].strip())
        elif hunk is None and line.startswith("+++ "):
            files[-1].new_path = _strip_diff_prefix(line[4:].strip())
        elif header := HUNK_HEADER.match(line):
            old_no, new_no = int(header[1]), int(header[3])
            old_left, new_left = int(header[2] or 1), int(header[4] or 1)
            hunk = []
            files[-1].hunks.append(hunk)
    return files


def _git_reading(path: Path, *flags: str) -> tuple[str, str]:
    # A missing final newline has a lint rule of its own; git would call it corrupt.
    data = path.read_bytes().removesuffix(b"\n") + b"\n"
    result = Git(Path("/"), owned=True).run("apply", *flags, input=data, check=False)
    out, err = (result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"))
    if result.returncode != 0:
        return "", err.strip() or f"git apply exit {result.returncode}"
    return out, ""


def touched_paths(path: Path) -> tuple[list[str], str]:
    """The files a patch changes as git reads it (plain ---/+++ too), or ([], why not)."""
    out, problem = _git_reading(path, "--numstat", "-z")  # out is "" when git cannot read it
    # Records are "added<TAB>deleted<TAB>path" or, for a rename, the same with an
    # empty path followed by the old and the new path as fields of their own.
    fields = iter(out.split("\0"))
    paths: list[str] = []
    for record in fields:
        if record:
            name = record.split("\t", 2)[2]
            paths += [name] if name else [next(fields, ""), next(fields, "")]
    return [p for p in paths if p], problem


def file_events(path: Path) -> list[str]:
    """git's summary of what a patch does besides changing lines: create, delete, mode, rename."""
    out = _git_reading(path, "--summary")[0]  # "" when git cannot read it
    return [line.strip() for line in out.splitlines() if line.strip()]


def line_naming(patch: Patch, file: str) -> int | None:
    heads, ends = ("diff --git ", "--- ", "+++ "), ("/" + file, " " + file)
    lines = enumerate(patch.text.split("\n"), 1)
    return next((n for n, line in lines if line.startswith(heads) and line.endswith(ends)), None)
