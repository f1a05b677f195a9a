"""TOML for Python 3.10 too (check-install on an Ubuntu 22.04 pod): tomllib where the
interpreter has it, else a small reader of the subset that patches/*.toml use.

The subset: comments; [table] and [[array of tables]] headers; bare, "basic" and
'literal' keys, dotted; one-line basic and literal strings; integers; decimal
floats; booleans; arrays (over several lines too) and inline tables. Anything
else (multi-line strings, dates, hex numbers, inf, a key defined twice) is refused
with its line, never read differently from tomllib (test/tools/test_tomlread.py).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["TOMLDecodeError", "loads", "subset_loads"]


class SubsetDecodeError(ValueError):
    """Text this reader does not understand, or TOML that is not valid; names the line."""


_BARE = re.compile(r"[A-Za-z0-9_-]+")
_NUMBER = re.compile(r"[+-]?(?:0|[1-9](?:_?[0-9])*)(?:\.[0-9](?:_?[0-9])*)?(?:[eE][+-]?[0-9]+)?")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}
_END_OF_VALUE = " \t\n#,]}"


def _has_control(text: str) -> bool:
    """A control character TOML allows in no comment or one-line string (tab is allowed)."""
    return any((ord(c) < 0x20 and c != "\t") or c == "\x7f" for c in text)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, problem: str) -> SubsetDecodeError:
        line = self.text.count("\n", 0, self.pos) + 1
        return SubsetDecodeError(f"{problem} (line {line})")

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def skip_space(self, newlines: bool = False) -> None:
        """Spaces and tabs; with newlines, also line ends and comments."""
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            elif newlines and char == "#":
                self.skip_comment()
            else:
                return

    def skip_comment(self) -> None:
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        if _has_control(self.text[self.pos : end].rstrip("\r")):
            raise self.fail("a control character in a comment")
        self.pos = end

    def end_of_line(self) -> None:
        self.skip_space()
        if self.peek() == "#":
            self.skip_comment()
        if self.peek(2) == "\r\n":
            self.pos += 2
        elif self.peek() == "\n" or self.pos == len(self.text):
            self.pos += 1
        else:
            raise self.fail(f"unexpected {self.peek()!r} after a value")

    def assign(self, table: dict[str, Any]) -> None:
        """KEY = VALUE, set in table."""
        keys = self.key()
        if self.peek() != "=":
            raise self.fail("an = was expected after a key")
        self.pos += 1
        _set(table, keys, self.value(), self)

    def key(self) -> list[str]:
        parts = []
        while True:
            self.skip_space()
            char = self.peek()
            if char == '"':
                parts.append(self.basic_string())
            elif char == "'":
                parts.append(self.literal_string())
            else:
                found = _BARE.match(self.text, self.pos)
                if not found:
                    raise self.fail("a key was expected")
                parts.append(found.group())
                self.pos = found.end()
            self.skip_space()
            if self.peek() != ".":
                return parts
            self.pos += 1

    def basic_string(self) -> str:
        self.no_multi_line('"""')
        out = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("a string that does not end")
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char == "\\":
                code = self.peek()
                if code in _ESCAPES:
                    out.append(_ESCAPES[code])
                    self.pos += 1
                elif code in "uU":
                    width = 4 if code == "u" else 8
                    digits = self.text[self.pos + 1 : self.pos + 1 + width]
                    if not re.fullmatch(rf"[0-9A-Fa-f]{{{width}}}", digits):
                        raise self.fail(f"a bad \\{code} escape")
                    value = int(digits, 16)
                    if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF:
                        raise self.fail(f"\\{code}{digits} is not a Unicode scalar value")
                    out.append(chr(value))
                    self.pos += 1 + width
                else:
                    raise self.fail(f"an escape this reader does not know: \\{code}")
            elif _has_control(char):
                raise self.fail("a control character or line end inside a string")
            else:
                out.append(char)

    def no_multi_line(self, quotes: str) -> None:
        if self.peek(3) == quotes:
            raise self.fail("multi-line strings are not in the subset this reader reads")
        self.pos += 1

    def literal_string(self) -> str:
        self.no_multi_line("'''")
        end = self.text.find("'", self.pos)
        value = self.text[self.pos : end] if end >= 0 else "\n"
        if end < 0 or _has_control(value):
            raise self.fail("a literal string that does not end on its line")
        self.pos = end + 1
        return value

    def value(self) -> Any:
        self.skip_space()
        char = self.peek()
        if char == '"':
            return self.basic_string()
        if char == "'":
            return self.literal_string()
        if char == "[":
            return self.array()
        if char == "{":
            return self.inline_table()
        for word, meaning in (("true", True), ("false", False)):
            if self.text.startswith(word, self.pos) and self._ends(self.pos + len(word)):
                self.pos += len(word)
                return meaning
        found = _NUMBER.match(self.text, self.pos)
        if found and self._ends(found.end()):
            self.pos = found.end()
            text = found.group().replace("_", "")
            return float(text) if any(c in text for c in ".eE") else int(text)
        raise self.fail("a value this reader does not know (dates, hex numbers, inf and nan "
                        "are not in its subset)")  # fmt: skip

    def _ends(self, pos: int) -> bool:
        return pos >= len(self.text) or self.text[pos] in _END_OF_VALUE or self.text[pos] == "\r"

    def array(self) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip_space(newlines=True)
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.value())
            self.skip_space(newlines=True)
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "]":
                raise self.fail("an array needs a comma or a ]")

    def inline_table(self) -> dict[str, Any]:
        self.pos += 1
        table: dict[str, Any] = {}
        self.skip_space()
        if self.peek() == "}":
            self.pos += 1
            return table
        while True:
            self.assign(table)
            self.skip_space()
            if self.peek() == "}":
                self.pos += 1
                return table
            if self.peek() != ",":
                raise self.fail("an inline table needs a comma or a }")
            self.pos += 1


def _descend(table: dict[str, Any], keys: list[str], reader: _Reader) -> dict[str, Any]:
    for key in keys:
        node = table.setdefault(key, {})
        if isinstance(node, list) and node and isinstance(node[-1], dict):
            node = node[-1]
        if not isinstance(node, dict):
            raise reader.fail(f"{key!r} is already a value, not a table")
        table = node
    return table


def _set(table: dict[str, Any], keys: list[str], value: Any, reader: _Reader) -> None:
    parent = _descend(table, keys[:-1], reader)
    if keys[-1] in parent:
        raise reader.fail(f"the key {'.'.join(keys)!r} is defined twice")
    parent[keys[-1]] = value


def subset_loads(text: str) -> dict[str, Any]:
    """The TOML subset our data files use, read without tomllib."""
    reader = _Reader(text)
    root: dict[str, Any] = {}
    current = root
    headers: set[tuple[str, ...]] = set()
    while True:
        reader.skip_space(newlines=True)
        if reader.pos >= len(text):
            return root
        if reader.peek(2) == "[[":
            reader.pos += 2
            keys = reader.key()
            if reader.peek(2) != "]]":
                raise reader.fail("an array-of-tables header needs ]]")
            reader.pos += 2
            parent = _descend(root, keys[:-1], reader)
            array = parent.setdefault(keys[-1], [])
            if not isinstance(array, list) or (tuple(keys) in headers):
                raise reader.fail(f"{'.'.join(keys)!r} is already a table or a value")
            current = {}
            array.append(current)
        elif reader.peek() == "[":
            reader.pos += 1
            keys = reader.key()
            if reader.peek() != "]":
                raise reader.fail("a table header needs ]")
            reader.pos += 1
            if tuple(keys) in headers:
                raise reader.fail(f"the table [{'.'.join(keys)}] is defined twice")
            headers.add(tuple(keys))
            current = _descend(root, keys, reader)
        else:
            reader.assign(current)
        reader.end_of_line()


try:
    from tomllib import TOMLDecodeError, loads
except ModuleNotFoundError:  # Python 3.10
    TOMLDecodeError = SubsetDecodeError  # type: ignore[misc,assignment]
    loads = subset_loads
