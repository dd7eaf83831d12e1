"""Inputs: checked and hashed before they are shown to a sandbox.

An input is bound read-only into the sandbox, but read-only does not stop everything: a unix
socket inside an input directory is a live channel to whatever host service listens on it
(``connect(2)`` needs no write permission), a FIFO lets the sandbox talk to a host reader, and a
device node is a device. So every input is walked first, without following links, and one that
contains a socket, FIFO or device node is refused with the path, before anything runs. The same
walk hashes the contents for the run record.

Limitation: the check happens before the sandbox starts; a host process that creates a socket in
the input directory after the check is not caught. Pass a copy of live directories.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.spec import InputFile

MAX_ENTRIES = 200_000
"""Entries walked per input directory before it is refused as too large to check."""

_HAZARDS = {
    stat.S_IFSOCK: "a unix socket (a live channel to a host service)",
    stat.S_IFIFO: "a FIFO (a channel to a host process)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


_PSEUDO_ROOTS = (Path("/proc"), Path("/sys"))
"""Kernel pseudo-filesystems: their files change as they are read (so the hash in the record
would not be what the program saw), and gVisor's gofer cannot serve them at all."""


def _hazard(mode: int) -> str | None:
    return _HAZARDS.get(stat.S_IFMT(mode))


def _hash_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def check_input_path(path: Path) -> os.stat_result:
    """The cheap part of :func:`inspect_input`: refuse an input on a pseudo-filesystem or one
    that is itself a socket, FIFO or device (ConfigError naming the path); its lstat otherwise.
    What a directory holds is checked by :func:`inspect_input`."""
    if any(path == root or root in path.parents for root in _PSEUDO_ROOTS):
        raise ConfigError(
            f"input {str(path)!r} is on a kernel pseudo-filesystem (/proc, /sys), whose files "
            "change as they are read; copy it to a regular file and pass that"
        )
    try:
        st = path.lstat()
    except OSError as exc:
        raise ConfigError(f"input {str(path)!r} cannot be read: {exc.strerror}") from None
    hazard = _hazard(st.st_mode)
    if hazard:
        raise ConfigError(
            f"input {str(path)!r} is {hazard}; only files and directories can be inputs"
        )
    return st


def inspect_input(item: InputFile) -> dict[str, object]:
    """Refuse a hazardous input (ConfigError naming the path); else its hashes for the record."""
    path = item.host_path
    st = check_input_path(path)
    if stat.S_ISREG(st.st_mode):
        digest, size = _hash_file(path)
        return {
            "name": item.name,
            "host_path": str(path),
            "kind": "file",
            "sha256": digest,
            "size": size,
        }
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"input {str(path)!r} is neither a file nor a directory")
    manifest = hashlib.sha256()
    files = 0
    total = 0
    seen = 0
    for root, dirs, names in os.walk(path, followlinks=False):
        dirs.sort()
        for name in sorted([*dirs, *names]):
            seen += 1
            if seen > MAX_ENTRIES:
                raise ConfigError(
                    f"input directory {str(path)!r} has more than {MAX_ENTRIES} entries; pass a "
                    "smaller directory or an archive of it"
                )
            entry = Path(root) / name
            est = entry.lstat()
            hazard = _hazard(est.st_mode)
            if hazard:
                raise ConfigError(
                    f"input directory {str(path)!r} contains {hazard} at {str(entry)!r}; remove "
                    "it or pass a copy of the directory without it"
                )
            if stat.S_ISREG(est.st_mode):
                digest, size = _hash_file(entry)
                manifest.update(f"{entry.relative_to(path)}\0{digest}\n".encode())
                files += 1
                total += size
    return {
        "name": item.name,
        "host_path": str(path),
        "kind": "directory",
        "sha256": manifest.hexdigest(),
        "files": files,
        "size": total,
    }


def inspect_inputs(inputs: Sequence[InputFile]) -> list[dict[str, object]]:
    """:func:`inspect_input` for each input, in order."""
    return [inspect_input(i) for i in inputs]
