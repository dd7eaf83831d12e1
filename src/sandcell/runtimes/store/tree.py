"""A runtime tree's content hash, and a cheap stat fingerprint that says when to hash again.

The hash covers every entry's relative path, kind, executable bit and content (a link's target),
in sorted order: two builds from the same wheels hash the same wherever they were built. Hashing
the datascience runtime reads about half a gigabyte, so a full check runs once per tree and user
state; afterwards a fingerprint of every entry's inode, size, mode and change time (which no
write can leave as it was) stands in for it, in the user's cache.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TreeSummary", "fingerprint", "summarize"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class TreeSummary:
    sha256: str
    files: int
    size_bytes: int


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result, str]]:
    """(relative path, lstat, absolute path) of every entry below ``root``, sorted, links not
    followed."""
    stack = [""]
    while stack:
        rel = stack.pop()
        base = os.path.join(root, rel) if rel else str(root)
        with os.scandir(base) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in reversed(entries):
            child = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append(child)
            yield child, st, entry.path
    # Sorted per directory and depth-first: a stable order that does not depend on the walk.


def summarize(root: Path) -> TreeSummary:
    """The content hash of the tree below ``root`` (see the module docstring)."""
    outer = hashlib.sha256()
    files = size = 0
    for rel, st, path in sorted(_walk(root), key=lambda t: t[0]):
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            outer.update(b"d\0" + rel.encode() + b"\0")
        elif stat.S_ISLNK(mode):
            outer.update(b"l\0" + rel.encode() + b"\0" + os.fsencode(os.readlink(path)) + b"\0")
        elif stat.S_ISREG(mode):
            inner = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    inner.update(chunk)
            kind = b"x" if mode & 0o111 else b"f"
            outer.update(kind + b"\0" + rel.encode() + b"\0" + inner.digest())
            files += 1
            size += st.st_size
        else:
            # A socket, FIFO or device has no place in a runtime: hash it as such, so that the
            # tree never matches a clean build.
            outer.update(b"?\0" + rel.encode() + b"\0")
    return TreeSummary(outer.hexdigest(), files, size)


def fingerprint(root: Path) -> str:
    """A hash of every entry's inode, size, mode and times: changes with any write."""
    h = hashlib.sha256()
    top = os.lstat(root)
    h.update(f"{top.st_ino}:{top.st_mode}:{top.st_ctime_ns}\n".encode())
    for rel, st, _ in _walk(root):
        h.update(
            f"{rel}\0{st.st_ino}:{st.st_size}:{st.st_mode}:{st.st_mtime_ns}:{st.st_ctime_ns}\n".encode()
        )
    return h.hexdigest()
