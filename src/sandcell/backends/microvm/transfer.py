"""Files across the VM boundary: inputs sent in, exported files received into a host directory.

Received files come from a hostile guest. :class:`FileSink` writes them into a fresh directory
the host made: each path must be relative, made of ordinary names (no ``..``, no empty or
over-long components, no NUL), at most :data:`MAX_DEPTH` deep; every file is created new
(``O_EXCL | O_NOFOLLOW``, through directory descriptors, never following a link), only regular
files and directories are ever created, and the number of entries and the total bytes are capped.
The host's export checks then run on that directory as on a namespaces workspace.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.microvm import channel
from sandcell.errors import SandcellError
from sandcell.spec import InputFile

MAX_DEPTH = 64
MAX_NAME = 255
MAX_STAND_IN = 1 << 44
"""Largest sparse stand-in made for a file too large to send."""
STAND_IN_TARGET = "sandcell: a symbolic link in the guest, not followed"
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TransferError(SandcellError):
    """The guest sent something the sink refuses; the message says what."""


@dataclass(frozen=True, slots=True)
class InputItem:
    """One entry to create under the guest's /inputs: a directory or a file."""

    path: str
    host_path: Path | None
    """The file to read (None for a directory)."""
    size: int


def input_items(inputs: tuple[InputFile, ...]) -> list[InputItem]:
    """The inputs as a flat list of directories and regular files (links are not followed)."""
    items: list[InputItem] = []
    for inp in inputs:
        _add(items, inp.host_path, inp.name, top=True)
    return items


def _add(items: list[InputItem], host: Path, rel: str, *, top: bool = False) -> None:
    try:
        # The input itself may be named through a link; nothing inside it is followed.
        st = os.stat(host) if top else os.lstat(host)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        items.append(InputItem(rel, None, 0))
        for name in sorted(os.listdir(host)):
            _add(items, host / name, f"{rel}/{name}")
    elif stat.S_ISREG(st.st_mode):
        items.append(InputItem(rel, host, st.st_size))


def input_frames(items: list[InputItem]) -> Iterator[bytes]:
    """The frames that create ``items`` in the guest."""
    for item in items:
        kind = "dir" if item.host_path is None else "file"
        meta = {"path": item.path, "type": kind, "size": item.size}
        yield channel.encode(channel.INPUT, json.dumps(meta).encode())
        if item.host_path is None:
            continue
        left = item.size
        with open(item.host_path, "rb") as f:
            while left > 0:
                data = f.read(min(channel.MAX_FRAME, left))
                if not data:
                    # Shrunk while read: pad, so the guest's framing stays whole.
                    data = b"\x00" * min(channel.MAX_FRAME, left)
                left -= len(data)
                yield channel.encode(channel.DATA, data)


def check_path(path: object) -> list[str]:
    """The components of a relative path from the guest; TransferError if it is not one."""
    if not isinstance(path, str) or not path or "\x00" in path or path.startswith("/"):
        raise TransferError(f"bad path {str(path)[:80]!r}")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH:
        raise TransferError(f"path {path[:80]!r} is deeper than {MAX_DEPTH}")
    for p in parts:
        if p in ("", ".", "..") or len(p.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise TransferError(f"bad path component in {path[:80]!r}")
    return parts


class FileSink:
    """Receives the guest's files into ``root`` (see module docstring)."""

    def __init__(self, root: Path, *, max_bytes: int, max_entries: int) -> None:
        root.mkdir(mode=0o700)
        self.root = root
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.total = 0
        self.entries = 0
        self._fd: int | None = None
        self._left = 0
        self._links = root.with_name(root.name + ".links")
        self.stand_ins: set[str] = set()
        """Paths of the stand-ins: never exported, whatever the host's caps."""
        self._linked = 0

    @property
    def expecting_data(self) -> bool:
        return self._fd is not None

    def _parent(self, parts: list[str]) -> int:
        fd = os.open(self.root, _O_DIR)
        try:
            for name in parts:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                nxt = os.open(name, _O_DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError as exc:
            os.close(fd)
            raise TransferError(
                f"cannot create directory {'/'.join(parts)[:80]!r}: {exc}"
            ) from None
        return fd

    def header(self, payload: bytes) -> None:
        if self._fd is not None:
            raise TransferError("a new file started before the last one ended")
        try:
            meta = json.loads(payload)
        except ValueError:
            raise TransferError("a file header is not JSON") from None
        if not isinstance(meta, dict):
            raise TransferError("a file header is not an object")
        parts = check_path(meta.get("path"))
        kind, size = meta.get("type"), meta.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise TransferError("a file header has no valid size")
        self.entries += 1
        if self.entries > self.max_entries:
            raise TransferError(f"more than {self.max_entries} files")
        if kind == "dir":
            os.close(self._parent(parts))
            return
        if kind != "file":
            raise TransferError(f"unknown entry type {str(kind)[:20]!r}")
        if self.total + size > self.max_bytes:
            raise TransferError(f"the files are over {self.max_bytes} bytes together")
        self.total += size
        parent = self._parent(parts[:-1])
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, 0o600, dir_fd=parent)
            nlink = meta.get("nlink", 1)
            if isinstance(nlink, int) and not isinstance(nlink, bool) and nlink > 1:
                # Hard-linked in the guest: a second link outside the exported tree, so the
                # host's export checks see (and refuse) a hard-linked file, as on the host.
                self._links.mkdir(mode=0o700, exist_ok=True)
                self._linked += 1
                os.link(parts[-1], self._links / str(self._linked), src_dir_fd=parent)
        except OSError as exc:
            raise TransferError(f"cannot create {meta['path'][:80]!r}: {exc.strerror}") from None
        finally:
            os.close(parent)
        if size == 0:
            os.close(fd)
            return
        self._fd, self._left = fd, size

    def data(self, payload: bytes) -> None:
        if self._fd is None:
            raise TransferError("file data without a file")
        if len(payload) > self._left:
            raise TransferError("a file is longer than its header said")
        os.write(self._fd, payload)
        self._left -= len(payload)
        if self._left == 0:
            os.close(self._fd)
            self._fd = None

    def stand_in(self, path: str, kind: str, size: object = 0) -> bool:
        """Create a stand-in for an entry the guest does not send: a dangling symlink for a
        link, a socket for a socket, a FIFO for another special file, a sparse file for one
        too large to send, so that the host's export checks refuse it with their own reasons.
        A link's target names nothing. False if refused."""
        try:
            parts = check_path(path)
        except TransferError:
            return False
        if kind not in ("symlink", "socket", "special", "oversized"):
            return False
        if kind == "oversized" and not (
            isinstance(size, int) and not isinstance(size, bool) and 0 < size <= MAX_STAND_IN
        ):
            return False
        self.entries += 1
        if self.entries > self.max_entries:
            return False
        parent = self._parent(parts[:-1])
        try:
            if kind == "symlink":
                os.symlink(STAND_IN_TARGET, parts[-1], dir_fd=parent)
            elif kind == "socket":
                # Bound through the directory's descriptor: the path stays short and no link
                # is followed. Closed at once: nothing listens.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.bind(f"/proc/self/fd/{parent}/{parts[-1]}")
            elif kind == "oversized":
                # Sparse, of the size the guest reported: refused by the host's size caps
                # without being read. Its zeros are never exported (see ``stand_ins``).
                fd = os.open(
                    parts[-1],
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                    0o600,
                    dir_fd=parent,
                )
                try:
                    os.ftruncate(fd, size)  # type: ignore[arg-type]
                finally:
                    os.close(fd)
            else:
                os.mkfifo(parts[-1], 0o600, dir_fd=parent)
        except OSError:
            return False
        finally:
            os.close(parent)
        self.stand_ins.add(path)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["FileSink", "InputItem", "TransferError", "check_path", "input_frames", "input_items"]
