"""What an export says about a workspace entry: whether its name may leave
(:func:`_name_problem`), how a name is printed (:func:`_display`), its media type
(:func:`_media_type`) and why an entry that is not a regular file is refused
(:func:`_type_reason`).

The threat: the names in a workspace were chosen by untrusted code, to confuse whoever reads them
later: newlines, terminal escape sequences, bytes that are not UTF-8; or whoever runs a command in
the export directory: ``rm *`` there reads a file named ``-rf`` as options, and names with leading
or trailing whitespace or made only of dots are trimmed, split or misread. Such a name never leaves
as an artifact, and a rejection prints it with control characters as ``\\xNN``. A media type comes
from the extension only: ``mimetypes`` given the whole name would take one starting with
``data:`` for a data URL and read the media type from the name itself.
"""

from __future__ import annotations

import mimetypes
import stat
import unicodedata
from pathlib import PurePosixPath

# A compressed file's media type is the compression's, not the content's (``.tar.gz``).
_ENCODING_MEDIA_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
_DEFAULT_MEDIA_TYPE = "application/octet-stream"


def _is_control(ch: str) -> bool:
    """C0 controls, DEL and C1 controls (Unicode category Cc): newlines, escapes, CSI."""
    return unicodedata.category(ch) == "Cc"


def _name_problem(raw: bytes) -> str | None:
    """Why a path component cannot be exported, or None if it can."""
    if raw in (b".", b".."):
        return "is '.' or '..'"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "is not valid UTF-8"
    if any(_is_control(ch) for ch in text):
        return "contains a control character"
    # The rest are names a shell glob in the export directory hands to a command as something
    # else: `rm *` given `-rf`, a name another tool trims, a name that looks like `..`.
    if text.startswith("-"):
        return "starts with '-', which a command given it through a shell glob reads as an option"
    if text[:1].isspace() or text[-1:].isspace():
        return "has leading or trailing whitespace, which shells and tools trim or split on"
    if text.strip(".") == "":
        return "is made only of dots, which reads as '.' or '..' to a person or a lax tool"
    return None


def _display(raw: bytes) -> str:
    """A component made safe to print: invalid bytes and control characters as ``\\xNN``."""
    text = raw.decode("utf-8", "backslashreplace")
    # Every Cc character is below U+0100, so two hex digits always suffice.
    return "".join(f"\\x{ord(ch):02x}" if _is_control(ch) else ch for ch in text)


def _media_type(name: str) -> str:
    """Media type from the extension only.

    Only the suffixes are given to ``mimetypes``, behind a fixed stem: it reads a path starting
    with ``data:`` as a data URL and would take the media type from the name itself.
    """
    suffixes = "".join(PurePosixPath(name).suffixes)
    media_type, encoding = mimetypes.guess_type("file" + suffixes, strict=False)
    if encoding is not None:
        return _ENCODING_MEDIA_TYPES.get(encoding, _DEFAULT_MEDIA_TYPE)
    return media_type or _DEFAULT_MEDIA_TYPE


def _type_reason(mode: int) -> str:
    """Why a non-regular file is refused, from its ``st_mode``."""
    if stat.S_ISLNK(mode):
        return "symbolic link: not exported (links are never followed)"
    if stat.S_ISDIR(mode):
        return "directory: not exported"
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO): not exported"
    if stat.S_ISSOCK(mode):
        return "socket: not exported"
    if stat.S_ISCHR(mode):
        return "character device: not exported"
    if stat.S_ISBLK(mode):
        return "block device: not exported"
    return f"not a regular file (mode {mode:#o}): not exported"
