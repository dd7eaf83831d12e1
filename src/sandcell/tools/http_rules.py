"""``METHOD /path`` rules of an HTTP tool, and the check of a path the program asks for.

A rule's path is split on ``/``: ``*`` matches one whole segment, ``**`` (last only) any number
of segments, anything else matches itself exactly. The program's path is checked before it is
matched: only unreserved characters and ``%XX`` escapes that do not decode to ``/``, ``\\``,
``.``, ``%`` or a control character, and no empty, ``.`` or ``..`` segments. So what the rule
checked is what the server receives; no spelling of a path can climb out of the prefix a rule
grants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
_SEGMENT_CHARS = re.compile(r"^(?:[A-Za-z0-9\-_.~!$&'()+,;=:@]|%[0-9A-Fa-f]{2})+$")
_RULE_SEGMENT = re.compile(r"^[A-Za-z0-9\-_.~!$&'()+,;=:@]+$")
_FORBIDDEN_ESCAPES = {"2f", "5c", "2e", "25"} | {f"{i:02x}" for i in range(0x20)} | {"7f"}


@dataclass(frozen=True, slots=True)
class HttpRule:
    """One allowed ``METHOD /path`` pattern."""

    method: str
    segments: tuple[str, ...]

    def show(self) -> str:
        """The rule as written in the profile."""
        return f"{self.method} /{'/'.join(self.segments)}"

    def matches(self, method: str, segments: tuple[str, ...]) -> bool:
        """Whether a checked request (see :func:`split_path`) is allowed by this rule."""
        if method != self.method:
            return False
        pattern = self.segments
        if pattern and pattern[-1] == "**":
            head = pattern[:-1]
            return len(segments) >= len(head) and _fits(head, segments[: len(head)])
        return len(segments) == len(pattern) and _fits(pattern, segments)


def _fits(pattern: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    return all(p in ("*", s) for p, s in zip(pattern, segments, strict=True))


def parse_http_rule(text: str) -> HttpRule:
    """``"GET /forecast/*"`` -> :class:`HttpRule`.

    Raises:
        ValueError: saying what is wrong with the rule.
    """
    method, sep, path = text.partition(" ")
    if not sep or method not in METHODS:
        raise ValueError(f"write METHOD /path with METHOD one of {', '.join(METHODS)}")
    if not path.startswith("/"):
        raise ValueError("the path must start with '/'")
    segments = tuple(path[1:].split("/")) if path != "/" else ()
    for i, seg in enumerate(segments):
        if seg == "**" and i != len(segments) - 1:
            raise ValueError("'**' may only end a path")
        if seg in (".", "..") or (seg not in ("*", "**") and not _RULE_SEGMENT.match(seg)):
            raise ValueError(
                f"path segment {seg!r} must be '*', '**' or plain characters "
                "(no '%', '?', '.' or '..')"
            )
    return HttpRule(method=method, segments=segments)


def split_path(path: str) -> tuple[str, ...]:
    """The segments of a path the program asked for, checked.

    Raises:
        ValueError: saying why the path is refused.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError("the path must be a string starting with '/'")
    if len(path) > 2048:
        raise ValueError("the path is longer than 2048 characters")
    if path == "/":
        return ()
    segments = tuple(path[1:].split("/"))
    for seg in segments:
        if not seg or seg in (".", "..") or not _SEGMENT_CHARS.match(seg):
            raise ValueError(
                f"path segment {seg!r} is refused: use letters, digits, '-_~' and %XX escapes; "
                "no empty, '.' or '..' segments, no query (pass query separately)"
            )
        for escape in re.findall(r"%([0-9A-Fa-f]{2})", seg):
            if escape.lower() in _FORBIDDEN_ESCAPES:
                raise ValueError(f"path segment {seg!r} has a refused escape %{escape}")
    return segments
