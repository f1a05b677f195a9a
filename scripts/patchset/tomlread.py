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
_WORDS = {"true": True, "false": False}


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

    def take(self, token: str, problem: str) -> None:
        if self.peek(len(token)) != token:
            raise self.fail(problem)
        self.pos += len(token)

    def skip_space(self, newlines: bool = False) -> None:
        """Spaces and tabs; with newlines, also line ends and comments."""
        while (char := self.peek()) and (char in " \t" or (newlines and char in "\r\n#")):
            if char == "#":
                self.skip_comment()
            else:
                self.pos += 1

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
        ending = "\r\n" if self.peek(2) == "\r\n" else self.peek()
        if ending not in ("\r\n", "\n", ""):
            raise self.fail(f"unexpected {self.peek()!r} after a value")
        self.pos += len(ending) or 1

    def descend(self, table: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        for key in keys:
            node = table.setdefault(key, {})
            if isinstance(node, list) and node and isinstance(node[-1], dict):
                node = node[-1]
            if not isinstance(node, dict):
                raise self.fail(f"{key!r} is already a value, not a table")
            table = node
        return table

    def assign(self, table: dict[str, Any]) -> None:
        """KEY = VALUE, set in table."""
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
            if self.peek() in ('"', "'"):
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
        """A one-line basic or literal string."""
        quote = self.peek()
        if self.peek(3) == quote * 3:
            raise self.fail("multi-line strings are not in the subset this reader reads")
        self.pos += 1
        if quote == "'":
            end = self.text.find("'", self.pos)
            value = self.text[self.pos : end] if end >= 0 else "\n"
            if end < 0 or _has_control(value):
                raise self.fail("a literal string that does not end on its line")
            self.pos = end + 1
            return value
        out = []
        while (char := self.peek()) != '"':
            if not char:
                raise self.fail("a string that does not end")
            self.pos += 1
            if char == "\\":
                out.append(self.escape())
            elif _has_control(char):
                raise self.fail("a control character or line end inside a string")
            else:
                out.append(char)
        self.pos += 1
        return "".join(out)

    def escape(self) -> str:
        code = self.peek()
        self.pos += 1
        if code in _ESCAPES:
            return _ESCAPES[code]
        width = {"u": 4, "U": 8}.get(code)
        if width is None:
            raise self.fail(f"an escape this reader does not know: \\{code}")
        digits = self.peek(width)
        if not re.fullmatch(rf"[0-9A-Fa-f]{{{width}}}", digits):
            raise self.fail(f"a bad \\{code} escape")
        if 0xD800 <= int(digits, 16) <= 0xDFFF or int(digits, 16) > 0x10FFFF:
            raise self.fail(f"\\{code}{digits} is not a Unicode scalar value")
        self.pos += width
        return chr(int(digits, 16))

    def value(self) -> Any:
        self.skip_space()
        char = self.peek()
        if char in ('"', "'"):
            return self.string()
        if char in ("[", "{"):
            return self.array() if char == "[" else self.inline_table()
        for word, meaning in _WORDS.items():
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
        return pos >= len(self.text) or self.text[pos] in " \t\r\n#,]}"

    def array(self) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip_space(newlines=True)
            if self.peek() == "]":
                break
            items.append(self.value())
            self.skip_space(newlines=True)
            if self.peek() != ",":
                break
            self.pos += 1
        self.take("]", "an array needs a comma or a ]")
        return items

    def inline_table(self) -> dict[str, Any]:
        self.pos += 1
        table: dict[str, Any] = {}
        self.skip_space()
        while table or self.peek() != "}":  # a comma before the } is not TOML 1.0
            self.assign(table)
            self.skip_space()
            if self.peek() != ",":
                break
            self.pos += 1
        self.take("}", "an inline table needs a comma or a }")
        return table


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
        if reader.peek() != "[":
            reader.assign(current)
            reader.end_of_line()
            continue
        close = "]]" if reader.peek(2) == "[[" else "]"
        reader.pos += len(close)
        keys = reader.key()
        reader.take(close, f"a table header needs {close}")
        if close == "]":
            if tuple(keys) in headers:
                raise reader.fail(f"the table [{'.'.join(keys)}] is defined twice")
            headers.add(tuple(keys))
            current = reader.descend(root, keys)
        else:
            array = reader.descend(root, keys[:-1]).setdefault(keys[-1], [])
            if not isinstance(array, list) or tuple(keys) in headers:
                raise reader.fail(f"{'.'.join(keys)!r} is already a table or a value")
            current = {}
            array.append(current)
        reader.end_of_line()


try:
    from tomllib import TOMLDecodeError, loads
except ModuleNotFoundError:  # Python 3.10
    TOMLDecodeError = SubsetDecodeError  # type: ignore[misc,assignment]
    loads = subset_loads
