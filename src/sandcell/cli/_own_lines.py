"""sandcell's own lines on stderr after text it did not write (a program's stderr).

A program's stderr may end mid-line; a note such as ``sandcell: timeout: ...`` printed right
after it would join that line. :class:`OwnLines` starts the first note on a new line when needed
and ends every note with a newline, so each is a line of its own for a person or a ``grep``.
"""

from __future__ import annotations

import sys


class OwnLines:
    """Writes sandcell's lines to stderr, each on a line of its own (see the module)."""

    def __init__(self, *, after: str = "") -> None:
        self._mid_line = bool(after) and not after.endswith("\n")

    def __call__(self, text: str) -> None:
        if self._mid_line:
            sys.stderr.write("\n")
            self._mid_line = False
        sys.stderr.write(text if text.endswith("\n") else text + "\n")


__all__ = ["OwnLines"]
