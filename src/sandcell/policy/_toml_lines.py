"""Line numbers of keys in a TOML file, for error messages that point at the offending line.

``tomllib`` gives a plain dict with no positions. Profile errors are far more useful with a line
number, so this module scans the text once and remembers where each table header and key first
appears. It understands what profile files use (``[table]`` and ``[a."b.c"]`` headers, bare,
quoted and dotted keys, multi-line strings and arrays); a key it cannot place (one inside an
inline table, say) falls back to the line of the nearest enclosing table, so a message always
points somewhere sensible. It is a locator for messages, not a parser: ``tomllib`` has already
accepted the text when this runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_KEY_PART = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_KEY = re.compile(rf"\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_HEADER = re.compile(rf"\s*\[\[?\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]\]?\s*(?:#.*)?$")
_PART = re.compile(_KEY_PART)


def _split_key(dotted: str) -> tuple[str, ...]:
    """``a."b.c".d`` -> ``("a", "b.c", "d")``; escapes in quoted parts are kept as written."""
    parts = []
    for match in _PART.finditer(dotted):
        part = match.group(0)
        if part[0] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


class LineIndex:
    """Where each table and key of a TOML text first appears (1-based line numbers)."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self._first: dict[tuple[str, ...], int] = {}
        self._starts: list[int] = []  # lines that begin a header or a key: ends of a value
        table: tuple[str, ...] = ()
        closing: str | None = None  # the delimiter of the multi-line string we are in
        for number, line in enumerate(self._lines, start=1):
            if closing is not None:
                if line.count(closing) % 2 == 1:
                    closing = None
                continue
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            header = _HEADER.match(line)
            if header:
                table = _split_key(header.group(1))
                self._remember(table, number)
                continue
            key = _KEY.match(line)
            if key is None:
                continue  # a continuation line of a multi-line array
            path = table + _split_key(key.group(1))
            # A dotted key also defines its intermediate tables on this line.
            for end in range(len(table) + 1, len(path) + 1):
                self._remember(path[:end], number)
            rest = line[key.end() :]
            for delimiter in ('"""', "'''"):
                if rest.count(delimiter) % 2 == 1:
                    closing = delimiter
                    break

    def _remember(self, path: tuple[str, ...], number: int) -> None:
        self._first.setdefault(path, number)
        if not self._starts or self._starts[-1] != number:
            self._starts.append(number)

    def line(self, path: Sequence[str]) -> int | None:
        """The line of ``path`` (a table or a key), else of its nearest enclosing table."""
        path = tuple(path)
        while path:
            if path in self._first:
                return self._first[path]
            path = path[:-1]
        return None

    def item_line(self, path: Sequence[str], item: str) -> int | None:
        """The line of the string ``item`` inside the (possibly multi-line) value of ``path``.

        Falls back to the line of the key itself when the item cannot be found as a quoted
        string within the value's lines.
        """
        start = self.line(path)
        if start is None:
            return None
        following = [n for n in self._starts if n > start]
        end = following[0] if following else len(self._lines) + 1
        for number in range(start, end):
            text = self._lines[number - 1]
            if f'"{item}"' in text or f"'{item}'" in text:
                return number
        return start
