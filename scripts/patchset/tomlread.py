"""TOML for Python 3.10 too (check-install on an Ubuntu 22.04 pod): tomllib where present,
else a reader of the subset patches/*.toml use (LF lines, comments, [table] headers, bare and
"quoted" dotted keys, one-line "strings", integers, booleans, arrays, inline tables); the rest
is refused with its line, never read differently from tomllib (test/tools/test_tomlread.py)."""

import re
from collections.abc import Callable
from typing import Any

__all__ = ["TOMLDecodeError", "loads", "subset_loads"]


class SubsetDecodeError(ValueError):
    """Text this reader does not understand, or TOML that is not valid; names the line."""


_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"(true|false|[+-]?(?:0|[1-9](?:_?[0-9])*))(?=[ \t\r\n#,\]}]|\Z)")
_SPACE = {False: re.compile(r"(?:[ \t]|#[^\n]*)*"), True: re.compile(r"(?:[ \t\n]|#[^\n]*)*")}
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)("?)')
# what TOML allows in no comment or one-line string (tab is allowed; a line end ends either)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, problem: str) -> SubsetDecodeError:
        line = self.text.count("\n", 0, self.pos) + 1
        return SubsetDecodeError(f"{problem} (line {line})")

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def take(self, token: str, problem: str) -> None:
        if self.peek(len(token)) != token:
            raise self.fail(problem)
        self.pos += len(token)

    def skip_space(self, newlines: bool = False) -> None:
        """Spaces, tabs and comments; with newlines, line ends too."""
        found = _SPACE[newlines].match(self.text, self.pos)
        if bad := _CONTROL.search(self.text, self.pos, found.end()):  # only a comment holds one
            self.pos = bad.start()
            raise self.fail("a control character in a comment")
        self.pos = found.end()

    def descend(self, table: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        for key in keys:
            if not isinstance(table := table.setdefault(key, {}), dict):
                raise self.fail(f"{key!r} is already a value, not a table")
        return table

    def assign(self, table: dict[str, Any]) -> None:
        keys = self.key()
        self.take("=", "an = was expected after a key")
        value = self.value()
        parent = self.descend(table, keys[:-1])
        if keys[-1] in parent:
            raise self.fail(f"the key {'.'.join(keys)!r} is defined twice")
        parent[keys[-1]] = value

    def key(self) -> list[str]:
        parts = []
        while True:
            self.skip_space()
            if self.peek() == '"':
                parts.append(self.string())
            elif found := _BARE.match(self.text, self.pos):
                parts.append(found.group())
                self.pos = found.end()
            else:
                raise self.fail("a key was expected")
            self.skip_space()
            if self.peek() != ".":
                return parts
            self.pos += 1

    def string(self) -> str:
        """A one-line basic string."""

        def unescape(escape: re.Match[str]) -> str:
            if escape[1] not in _ESCAPES:
                raise self.fail(f"an escape this reader does not know: \\{escape[1]}")
            return _ESCAPES[escape[1]]

        found = _STRING.match(self.text, self.pos)
        bad = _CONTROL.search(self.text, self.pos, found.end(1))
        self.pos = bad.start() if bad else found.end()
        if bad or not found[2]:
            raise self.fail("a control character or line end inside a string")
        return re.sub(r"\\(.)", unescape, found[1])

    def value(self) -> Any:
        self.skip_space()
        char = self.peek()
        if self.peek(3) in ('"""', "'''"):
            raise self.fail("multi-line strings are not in the subset this reader reads")
        if char == '"':
            return self.string()
        if char == "[":  # items on several lines, a comma before the ] allowed
            return self.items("]", lambda out: out.append(self.value()), [], newlines=True)
        if char == "{":  # one line; a comma before the } is not TOML 1.0
            return self.items("}", self.assign, {}, newlines=False)
        if found := _SCALAR.match(self.text, self.pos):
            self.pos, word = found.end(), found.group()
            return word == "true" if word in ("true", "false") else int(word.replace("_", ""))
        raise self.fail("a value this reader does not know (e.g. 'literal' strings, dates, floats)")

    def items(self, close: str, read: Callable[[Any], None], out: Any, newlines: bool) -> Any:
        """An array's values or an inline table's KEY = VALUE pairs, read into out up to close."""
        self.pos += 1
        while True:
            self.skip_space(newlines)
            if self.peek() == close and (newlines or not out):
                break
            read(out)
            self.skip_space(newlines)
            if self.peek() != ",":
                break
            self.pos += 1
        what = "an array" if close == "]" else "an inline table"
        self.take(close, f"{what} needs a comma or a {close}")
        return out


def subset_loads(text: str) -> dict[str, Any]:
    reader = _Reader(text)
    root: dict[str, Any] = {}
    current = root
    headers: set[tuple[str, ...]] = set()
    while True:
        reader.skip_space(newlines=True)
        if reader.pos >= len(text):
            return root
        if reader.peek(2) == "[[":
            raise reader.fail("arrays of tables are not in the subset this reader reads")
        if reader.peek() != "[":
            reader.assign(current)
        else:
            reader.pos += 1
            keys = reader.key()
            reader.take("]", "a table header needs ]")
            if tuple(keys) in headers:
                raise reader.fail(f"the table [{'.'.join(keys)}] is defined twice")
            headers.add(tuple(keys))
            current = reader.descend(root, keys)
        reader.skip_space()
        if reader.peek() not in ("\n", ""):  # LF only, as lint requires of our files
            raise reader.fail(f"unexpected {reader.peek()!r} after a value")
        reader.pos += 1


try:
    from tomllib import TOMLDecodeError, loads
except ModuleNotFoundError:  # Python 3.10
    TOMLDecodeError = SubsetDecodeError  # type: ignore[misc,assignment]
    loads = subset_loads
