"""Terminal safety: output of untrusted code, made harmless to print.

A terminal obeys what it is sent. Output that reaches one unfiltered can recolour or hide text,
move the cursor and overwrite what was shown (a fake "all tests passed"), set the window title,
write to the clipboard (OSC 52), show a link whose target differs from its text (OSC 8), answer
queries with input to the shell (some terminals, through DCS and device status reports), or,
with Unicode bidirectional overrides, show text in an order that differs from its bytes (the
"Trojan Source" trick).

Every escape or control sequence starts with a character from a small set: ESC (7-bit CSI, OSC,
DCS, APC, PM, SOS all begin with it), a C1 control (their 8-bit forms: U+009B is CSI, U+009D is
OSC...), or another C0 control. :func:`neutralise` rewrites each of those characters as a
visible escape (``\\x1b``, ``\\x9b``, ``\\u202e``), so no sequence can start and the reader sees
exactly what was there. The rest of a sequence (``[31m``) stays as the plain text it then is.

Neutralising is for display only: the stored and returned output keeps the exact text, and
whatever prints it to a terminal (the CLI, a log viewer) neutralises it on the way out.
"""

from __future__ import annotations

import re

__all__ = ["is_tty_safe", "neutralise"]

# C0 controls except tab and newline; carriage return unless it ends a line (CRLF), since a lone
# CR returns the cursor and lets later text overwrite what was shown; DEL; C1 controls; the bidi
# embeddings, overrides and isolates; and lone surrogates (bytes that were not UTF-8), which a
# terminal cannot show and which make printing fail.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]|\r(?!\n)"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def neutralise(text: str) -> str:
    """``text`` with every character that can control a terminal written as a visible escape.

    Tab, newline, CRLF line ends and all ordinary Unicode (accents, CJK, emoji, right-to-left
    scripts) are kept as they are.
    """
    return _UNSAFE.sub(_escape, text)


def is_tty_safe(text: str) -> bool:
    """Whether ``text`` can be printed to a terminal as it is (:func:`neutralise` would keep it)."""
    return _UNSAFE.search(text) is None
