"""The leak scan: secrets and credentials in what leaves the sandbox are redacted and reported.

No secret of the host is ever put in the sandbox (a clean environment, no credentials mounted),
so a secret in the output means one of two things: the code found a credential somewhere it
could read (an input file, a dataset with a key in it), or a host secret reached the sandbox by
a path nobody meant. Either way, it must not travel on to a model's context, a log or a
ticket. Everything that leaves the sandbox (stdout, stderr, the declared result, artifacts) is
scanned for:

* **known secrets**: values the caller knows are secret (typically the host environment's
  secret values), by exact match and in their base64 forms (standard and URL-safe, at any
  alignment, so ``Authorization: Basic base64(user:password)`` is caught too). Values shorter
  than :data:`MIN_SECRET_CHARS` are ignored: they cannot be told apart from ordinary text;
* **token patterns** with few false positives (:data:`DEFAULT_PATTERNS`): cloud and service
  API keys with a recognisable prefix, JWTs, PEM private key blocks, credentials in URLs, and
  (as ``warning``) ``password=``-style assignments of a long value.

Every match is replaced by ``[REDACTED:<kind>]`` and reported as a :class:`Leak` whose preview
shows at most the public prefix and the last four characters (``ghp_…abcd``), never the secret.

Guarantees
----------
* Idempotent: scanning redacted text again changes nothing and reports nothing. Markers already
  in the text are never matched, and a scan repeats until nothing more is found (a redaction can
  make a neighbouring token stand alone).
* Never breaks text: in text, spans are whole code points. :meth:`Redactor.scan_bytes` scans
  the bytes themselves; the patterns are ASCII and UTF-8 never has an ASCII byte inside a
  multi-byte character, so no match splits one, and every byte outside a match (valid UTF-8
  or not) comes back exactly as it was.
* Linear time in practice: every pattern is anchored on a literal or bounded in length; about
  a second for a 64 MiB artifact.

Limits: a scan sees plain text only. A secret inside a compressed archive, an image, or encoded
in some other way (hex, reversed, split across lines) is not found. This is defence in depth; the
boundary is that secrets are never in the sandbox.
"""

from __future__ import annotations

import base64
import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import AnyStr, Generic

from sandcell.errors import ConfigError
from sandcell.validation.patterns import DEFAULT_PATTERNS, Pattern, Severity

__all__ = [
    "DEFAULT_PATTERNS",
    "MIN_SECRET_CHARS",
    "Leak",
    "Pattern",
    "Redactor",
    "Severity",
]

MIN_SECRET_CHARS = 8
"""Known secrets shorter than this are not searched for: ``1`` or ``true`` would be found
everywhere, and a redaction everywhere is no redaction."""

_MAX_PASSES = 8
"""A scan repeats until nothing new is found; each pass shrinks the text that can match, so
this bound is never reached in practice."""

_MIN_BASE64_CORE = 10
"""Shortest base64 fragment of a known secret searched for (60 bits: no chance collisions)."""

_MARKER = re.compile(r"\[REDACTED:[a-z0-9_]+\]")


@dataclass(frozen=True, slots=True, kw_only=True)
class Leak:
    """One redacted secret."""

    kind: str
    severity: Severity
    start: int
    """Offset of the secret in the scanned text (characters for text, bytes for bytes)."""
    end: int
    line: int
    """1-based line of the scanned text where the secret starts."""
    preview: str
    """Enough to recognise which secret it was, never the secret: ``ghp_…abcd``."""
    stream: str = ""
    """Where it was found: ``stdout``, ``stderr``, ``result``, or an artifact's path."""


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    end: int
    kind: str
    severity: Severity
    priority: int
    """Lower wins when spans overlap: known secrets, then token shapes, then guesses."""
    public_end: int
    """End of the public prefix shown in the preview (``start`` when there is none)."""
    show_suffix: bool


def _base64_forms(secret: str) -> set[str]:
    """The base64 text a secret becomes, wherever it sits in the encoded data.

    Base64 encodes 3 bytes as 4 characters, so a secret that starts at byte offset 0, 1 or 2
    (mod 3) of the encoded data turns into three different strings. Of each, only the characters
    that depend on the secret's bytes alone are searched for.
    """
    raw = secret.encode("utf-8", "surrogateescape")
    forms: set[str] = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode("ascii")
        first = -(-8 * shift // 6)  # the first character with no bit of the padding bytes
        last = 8 * (shift + len(raw)) // 6  # past the last character with only secret bits
        core = encoded[first:last]
        if shift == 0:
            core = encoded.rstrip("=")  # on its own, the tail is known too
        if len(core) >= _MIN_BASE64_CORE:
            forms.add(core)
            forms.add(core.translate(str.maketrans("+/", "-_")))
    return forms


class Redactor:
    """Finds and redacts secrets; one instance serves any number of scans.

    Args:
        known_secrets: Values that are secret, such as the host environment's secret values.
            Searched for exactly and in base64; values shorter than :data:`MIN_SECRET_CHARS`
            or only whitespace are ignored.
        patterns: Shapes of secrets (:data:`DEFAULT_PATTERNS` unless given).
    """

    def __init__(
        self,
        known_secrets: Sequence[str] = (),
        patterns: Sequence[Pattern] = DEFAULT_PATTERNS,
    ) -> None:
        needles: dict[str, str] = {}
        for secret in known_secrets:
            if len(secret) < MIN_SECRET_CHARS or not secret.strip():
                continue
            for form in _base64_forms(secret):
                needles.setdefault(form, "known_secret_base64")
            needles[secret] = "known_secret"
        # Longest first: a secret that contains another is redacted whole.
        ordered = sorted(needles.items(), key=lambda item: -len(item[0]))
        self._text = _Engine(
            needles=ordered,
            patterns=[(p, p.regex) for p in patterns],
            marker=_MARKER,
        )
        # Bytes are scanned as bytes, never decoded: a 64 MiB binary artifact decoded with
        # surrogateescape is a quarter of a gigabyte of str, and ten times slower to search.
        # Every pattern is ASCII, and UTF-8 never has an ASCII byte inside a multi-byte
        # character, so a match never splits one.
        self._bytes = _Engine(
            needles=[(n.encode("utf-8", "surrogatepass"), kind) for n, kind in ordered],
            patterns=[(p, _bytes_regex(p.regex)) for p in patterns],
            marker=re.compile(_MARKER.pattern.encode("ascii")),
        )

    def scan_text(self, text: str) -> tuple[str, tuple[Leak, ...]]:
        """Redact ``text``; return it with the leaks found, in order of position.

        Offsets in the leaks are character offsets in ``text`` as given.
        """
        return self._text.scan(text)

    def scan_bytes(self, data: bytes) -> tuple[bytes, tuple[Leak, ...]]:
        """Redact ``data`` (any bytes, text in UTF-8 or not). Offsets are byte offsets."""
        return self._bytes.scan(data)


def _bytes_regex(regex: re.Pattern[str]) -> re.Pattern[bytes]:
    try:
        return re.compile(regex.pattern.encode("ascii"), regex.flags & ~re.UNICODE)
    except (UnicodeEncodeError, re.error) as exc:
        raise ConfigError(
            f"pattern {regex.pattern!r} cannot be used on bytes: {exc}; write it in ASCII"
        ) from None


@dataclass(frozen=True, slots=True)
class _Edit:
    """One replacement made by a pass: where the marker is now, and what it replaced."""

    new_start: int
    new_end: int
    old_start: int
    old_end: int


@dataclass(frozen=True, slots=True)
class _Engine(Generic[AnyStr]):
    """The scan, for one string type (``str`` for text, ``bytes`` for bytes)."""

    needles: Sequence[tuple[AnyStr, str]]
    patterns: Sequence[tuple[Pattern, re.Pattern[AnyStr]]]
    marker: re.Pattern[AnyStr]

    def scan(self, text: AnyStr) -> tuple[AnyStr, tuple[Leak, ...]]:
        leaks: list[Leak] = []
        # Each pass maps its offsets back to the original text through the edits of the
        # passes before it (newest first).
        history: list[list[_Edit]] = []
        current = text
        for _ in range(_MAX_PASSES):
            spans = self._find(current)
            if not spans:
                break
            for span in spans:
                start = _to_original(span.start, history)
                leaks.append(
                    Leak(
                        kind=span.kind,
                        severity=span.severity,
                        start=start,
                        end=start + (span.end - span.start),
                        line=0,  # filled in below, in one walk over the text
                        preview=_preview(
                            current[span.start : span.end],
                            span.public_end - span.start,
                            show_suffix=span.show_suffix,
                        ),
                    )
                )
            current, edits = _apply(current, spans)
            history.insert(0, edits)
        leaks.sort(key=lambda leak: leak.start)
        return current, tuple(_with_lines(text, leaks))

    def _find(self, text: AnyStr) -> list[_Span]:
        """The spans to redact in ``text``: non-overlapping, sorted, none touching a marker."""
        found: list[_Span] = []
        for needle, kind in self.needles:
            i = text.find(needle)
            while i != -1:
                found.append(_Span(i, i + len(needle), kind, "secret", 0, i, show_suffix=True))
                i = text.find(needle, i + len(needle))
        lowered: AnyStr | None = None
        for pattern, regex in self.patterns:
            priority = 1 if pattern.severity == "secret" else 2
            group = "secret" if "secret" in regex.groupindex else 0
            has_public = "public" in regex.groupindex
            subject = text
            if pattern.ascii_lower:
                lowered = _ascii_lower(text) if lowered is None else lowered
                subject = lowered
            for match in regex.finditer(subject):
                start, end = match.span(group)
                # A PEM block's trailing newline is not part of the key.
                while end > start and text[end - 1 : end].isspace():
                    end -= 1
                if end <= start:
                    continue
                public_end = match.end("public") if has_public else start
                found.append(
                    _Span(
                        start,
                        end,
                        pattern.kind,
                        pattern.severity,
                        priority,
                        max(start, public_end),
                        pattern.show_suffix,
                    )
                )
        if not found:
            return []
        markers = [m.span() for m in self.marker.finditer(text)]
        marker_starts = [s for s, _ in markers]
        merged: list[_Span] = []
        for span in sorted(found, key=lambda s: (s.start, -s.end, s.priority)):
            # A marker is never matched again: this is what makes redaction idempotent.
            i = bisect.bisect_right(marker_starts, span.end - 1) - 1
            if i >= 0 and markers[i][1] > span.start:
                continue
            if merged and span.start < merged[-1].end:
                # Overlapping finds become one redaction, named after the most certain kind.
                last = merged[-1]
                best = last if last.priority <= span.priority else span
                merged[-1] = replace(
                    best,
                    start=last.start,
                    end=max(last.end, span.end),
                    public_end=last.public_end if best is last else last.start,
                )
                continue
            merged.append(span)
        return merged


def _apply(text: AnyStr, spans: list[_Span]) -> tuple[AnyStr, list[_Edit]]:
    """Replace each span by its marker; return the new text and the edits made."""
    parts: list[AnyStr] = []
    edits: list[_Edit] = []
    pos = new_pos = 0
    for span in spans:
        parts.append(text[pos : span.start])
        new_pos += span.start - pos
        marker = _marker(text, span.kind)
        parts.append(marker)
        edits.append(_Edit(new_pos, new_pos + len(marker), span.start, span.end))
        new_pos += len(marker)
        pos = span.end
    parts.append(text[pos:])
    return text[:0].join(parts), edits


def _marker(like: AnyStr, kind: str) -> AnyStr:
    marker = f"[REDACTED:{kind}]"
    if isinstance(like, str):
        return marker
    return marker.encode("ascii")


def _to_original(position: int, history: list[list[_Edit]]) -> int:
    """Map an offset in a later pass's text (outside any marker) back to the original text."""
    for edits in history:
        i = bisect.bisect_right([e.new_end for e in edits], position) - 1
        if i >= 0:
            position = edits[i].old_end + (position - edits[i].new_end)
    return position


def _preview(secret: str | bytes, public: int, *, show_suffix: bool) -> str:
    """``ghp_…abcd``: the public prefix, and the last four characters only of a long secret."""
    hidden = len(secret) - public
    suffix = secret[-4:] if show_suffix and hidden >= 16 else secret[:0]
    prefix = secret[:public]
    if isinstance(prefix, bytes) and isinstance(suffix, bytes):
        return f"{_show(prefix)}…{_show(suffix)}"
    return f"{prefix!s}…{suffix!s}"


def _show(data: bytes) -> str:
    # Only ASCII pattern prefixes and the tail of a token reach here; anything else is shown
    # as an escape rather than guessed at.
    return data.decode("ascii", "backslashreplace")


def _with_lines(text: AnyStr, leaks: list[Leak]) -> list[Leak]:
    newline = _newline(text)
    out: list[Leak] = []
    line, pos = 1, 0
    for leak in leaks:
        line += text.count(newline, pos, leak.start)
        pos = leak.start
        out.append(replace(leak, line=line))
    return out


def _newline(like: AnyStr) -> AnyStr:
    if isinstance(like, str):
        return "\n"
    return b"\n"


def _ascii_lower(text: AnyStr) -> AnyStr:
    """``text`` with A-Z in lower case and every offset unchanged."""
    if isinstance(text, bytes) or text.isascii():
        return text.lower()  # bytes.lower changes ASCII letters only
    # str.lower may change lengths ("İ" becomes two characters) and is slow on large text;
    # through UTF-8, only the ASCII bytes change, so every character keeps its place.
    return text.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")
