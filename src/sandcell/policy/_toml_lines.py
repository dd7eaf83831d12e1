"""Line numbers of keys in a TOML file, for error messages that point at the offending line.

``tomllib`` gives a plain dict with no positions. Profile errors are far more useful with a line
number, so this module scans the text once and remembers where each table header and key first
appears. It understands what profile files use (``[table]`` and ``[a."b.c"]`` headers, bare,
quoted and dotted keys, multi-line strings and arrays); a key it cannot place (one inside an
inline table, say) falls back to the line of the nearest enclosing table, so a message always
points somewhere sensible. It is a locator for messages, not a parser: ``tomllib`` parses.

:class:`TomlDoc` wraps the parsed file with typed reads whose errors carry those lines, and
:class:`ProfileError` is the error they raise (re-exported by :mod:`sandcell.policy.profiles`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Sequence
from typing import NoReturn, cast

from sandcell.errors import ConfigError

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


class ProfileError(ConfigError):
    """A profile file is invalid: ``<file>:<line>: <reason>`` (no line when none applies)."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


_SYNTAX_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


class TomlDoc:
    """A parsed TOML file whose errors point at lines: typed reads of optional keys.

    Every read takes the full key path (``("limits", "memory_mb")``) and returns None when the
    key is absent, so the caller can leave the default in place.
    """

    def __init__(self, shown: str, raw: bytes) -> None:
        self.shown = shown
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProfileError(shown, None, f"not UTF-8 text ({exc.reason})") from None
        try:
            self.data: dict[str, object] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            message = str(exc)
            at = _SYNTAX_AT.search(message)
            if at:  # "Invalid value (at line 3, column 5)" -> line 3, "invalid value (column 5)"
                reason = f"invalid TOML: {message[: at.start()]} (column {at.group(2)})"
                raise ProfileError(shown, int(at.group(1)), reason) from None
            line = len(text.splitlines()) or None  # "(at end of document)"
            raise ProfileError(shown, line, f"invalid TOML: {message}") from None
        self.lines = LineIndex(text)

    def fail(self, reason: str, path: Sequence[str], item: str | None = None) -> NoReturn:
        """Raise :class:`ProfileError` at the line of ``path`` (or of ``item`` in its value)."""
        line = self.lines.line(path) if item is None else self.lines.item_line(path, item)
        raise ProfileError(self.shown, line, reason)

    def table(self, path: Sequence[str], known: Collection[str] | None) -> dict[str, object]:
        """The table at ``path`` ({} when absent), refusing keys not in ``known`` (if given)."""
        value: object = self.data
        for i, part in enumerate(path):
            assert isinstance(value, dict)
            value = value.get(part, {})
            if not isinstance(value, dict):
                self.fail(f"{_name(path[: i + 1])} must be a table", path[: i + 1])
        table = cast("dict[str, object]", value)
        for key in table:
            if known is not None and key not in known:
                where = f"in [{'.'.join(path)}]" if path else "at the top level"
                choices = ", ".join(known)
                self.fail(f"unknown key {key!r} {where}; known keys: {choices}", (*path, key))
        return table

    def _get(self, path: Sequence[str]) -> object:
        value: object = self.data
        for part in path:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def string(self, path: Sequence[str]) -> str | None:
        """A string, or None when absent."""
        value = self._get(path)
        if value is not None and not isinstance(value, str):
            self.fail(f"{_name(path)} must be a string, got {value!r}", path)
        return value

    def integer(self, path: Sequence[str], *, number: bool = False) -> int | float | None:
        """An integer (or, with ``number``, an integer or a float), or None when absent."""
        value = self._get(path)
        kinds = (int, float) if number else (int,)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            what = "a number" if number else "an integer"
            self.fail(f"{_name(path)} must be {what}, got {value!r}", path)
        return value

    def boolean(self, path: Sequence[str]) -> bool | None:
        """``true`` or ``false``, or None when absent."""
        value = self._get(path)
        if value is not None and not isinstance(value, bool):
            self.fail(f"{_name(path)} must be true or false, got {value!r}", path)
        return value

    def strings(self, path: Sequence[str]) -> tuple[str, ...] | None:
        """A list of strings as a tuple, or None when absent."""
        value = self._get(path)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(f"{_name(path)} must be a list of strings, got {value!r}", path)
        return tuple(cast("list[str]", value))

    def integers(self, path: Sequence[str]) -> tuple[int, ...] | None:
        """A list of integers as a tuple, or None when absent."""
        value = self._get(path)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            self.fail(f"{_name(path)} must be a list of integers, got {value!r}", path)
        return tuple(cast("list[int]", value))


def _name(path: Sequence[str]) -> str:
    """``("limits", "memory_mb")`` -> ``[limits] memory_mb``, for messages."""
    if len(path) == 1:
        return path[0]
    return f"[{'.'.join(path[:-1])}] {path[-1]}"
