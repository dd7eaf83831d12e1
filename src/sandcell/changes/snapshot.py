"""Copy-in: a working directory frozen into one archive before the run, and its manifest.

The archive is made on the host, from the same descriptors the manifest hashes, so what the
sandbox unpacks is exactly what the manifest says the run started from, whatever happens to the
host directory afterwards. It reaches the sandbox as an ordinary read-only input, which every
backend carries the same way (a bind mount, the gofer, the VM's input frames), and the program's
prologue unpacks it into the writable workspace: no write can reach the host copy because the
sandbox never sees it. Size and entry count are checked against the run's workspace limits
before anything is copied.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.changes.credentials import (
    LeftOut,
    describe,
    is_git_config,
    is_left_out,
    scrub_git_config,
)
from sandcell.changes.manifest import (
    Entry,
    Manifest,
    Walked,
    entry_of,
    is_git,
    open_root,
    walk,
)
from sandcell.errors import ConfigError
from sandcell.spec import Limits

_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BLOCK = 4096


@dataclass(frozen=True, slots=True)
class Snapshot:
    source: Path
    archive: Path
    manifest: Manifest
    left_out: tuple[LeftOut, ...] = ()
    """What the sandbox did not get as it is on the host (credentials)."""


class _Hashing(io.RawIOBase):
    """Reads a descriptor for tarfile while hashing what it hands out."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.h = hashlib.sha256()
        self.n = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = os.read(self.fd, len(b))
        b[: len(data)] = data
        self.h.update(data)
        self.n += len(data)
        return len(data)


def check_fits(source: Path, limits: Limits) -> None:
    """Refuse (ConfigError) a directory that cannot fit the workspace, before copying any of
    it: its entries against ``workspace_inodes``, its bytes (in blocks) against
    ``workspace_bytes``; hazards (sockets, FIFOs, devices) are refused by the walk."""
    root = open_root(source)
    total = 0
    try:
        for w in walk(root, max_entries=limits.workspace_inodes - 1, what=f"{str(source)!r}"):
            if stat.S_ISREG(w.st.st_mode):
                total += -(-w.st.st_size // _BLOCK) * _BLOCK
    finally:
        os.close(root)
    if total > limits.workspace_bytes:
        raise ConfigError(
            f"{str(source)!r} holds about {total} bytes, more than the workspace's "
            f"{limits.workspace_bytes}; pass a smaller directory or raise --workspace"
        )


def take(source: Path, archive: Path, limits: Limits, *, leave_out: Sequence[str] = ()) -> Snapshot:
    """Check that ``source`` fits (:func:`check_fits`), then write it into ``archive`` (a new
    file) and return the snapshot with its manifest (``.git`` copied but not in the manifest).
    Files named by ``leave_out`` and the credentials in git config files stay on the host
    (:mod:`sandcell.changes.credentials`); the manifest keeps such files as they are on the
    host, so that applying compares the whole target. ConfigError when it cannot be read whole
    (an unreadable entry, a file changing size while it is copied)."""
    source = source.resolve()
    try:
        return _take(source, archive, limits, tuple(leave_out))
    except (OSError, tarfile.TarError) as exc:
        raise ConfigError(
            f"--workdir-from {str(source)!r} could not be copied: {exc}; make every entry "
            "readable and keep the directory still while the run starts"
        ) from None


def _take(source: Path, archive: Path, limits: Limits, leave_out: tuple[str, ...]) -> Snapshot:
    check_fits(source, limits)
    root = open_root(source)
    entries: dict[str, Entry] = {}
    left_out: list[LeftOut] = []
    git = 0
    total = 0
    try:
        fd_out = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with (
            os.fdopen(fd_out, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for w in walk(root, max_entries=limits.workspace_inodes - 1, what=f"{str(source)!r}"):
                info = tarfile.TarInfo(w.rel)
                info.mode = stat.S_IMODE(w.st.st_mode)
                info.mtime = int(w.st.st_mtime)
                info.uid = info.gid = 0
                if (
                    not is_git(w.rel)
                    and not stat.S_ISDIR(w.st.st_mode)
                    and is_left_out(w.name, leave_out)
                ):
                    entry = entry_of(w)
                    why = "named by the profile's [workdir] leave_out: not copied"
                    left_out.append(LeftOut(w.rel, why))
                elif stat.S_ISLNK(w.st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(w.name, dir_fd=w.parent_fd)
                    tar.addfile(info)
                    entry = Entry("symlink", 0, target=info.linkname)
                elif stat.S_ISDIR(w.st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    entry = Entry("dir", info.mode)
                elif is_git_config(w.rel):
                    entry, note = _add_git_config(tar, info, w)
                    if note is not None:
                        left_out.append(LeftOut(w.rel, note))
                else:
                    fd = os.open(w.name, _O_FILE, dir_fd=w.parent_fd)
                    try:
                        info.size = os.fstat(fd).st_size
                        reader = _Hashing(fd)
                        tar.addfile(info, io.BufferedReader(reader))
                    finally:
                        os.close(fd)
                    entry = Entry("file", info.mode, sha256=reader.h.hexdigest(), size=reader.n)
                if is_git(w.rel):
                    git += 1
                    continue
                entries[w.rel] = entry
                total += entry.size
    finally:
        os.close(root)
    manifest = Manifest(
        entries=entries,
        git_entries=git,
        total_bytes=total,
        left_out=tuple(x.path for x in left_out if not is_git(x.path)),
    )
    return Snapshot(source, archive, manifest, tuple(left_out))


def _add_git_config(
    tar: tarfile.TarFile, info: tarfile.TarInfo, w: Walked
) -> tuple[Entry, str | None]:
    """Copy a git config file without its credentials: its entry as it is on the host (what
    the target is compared with) and what was taken out (None: nothing)."""
    fd = os.open(w.name, _O_FILE, dir_fd=w.parent_fd)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    scrubbed, removed = scrub_git_config(data)
    info.size = len(scrubbed)
    tar.addfile(info, io.BytesIO(scrubbed))
    entry = Entry("file", info.mode, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    return entry, describe(removed) if removed else None
