"""A workspace's files as one tar file, and back: what a files-only pause keeps of a sandbox.

:func:`pack` writes the tree under a workspace the host can read (a tmpfs on the host, or the
workspace helper's view of one) into a new tar file; :func:`unpack` recreates such a tree under
an empty workspace. Both treat the tree as hostile, since the sandbox made it:

* nothing is followed: every step is an ``openat`` relative to an open directory with
  ``O_NOFOLLOW``, so a link the sandbox planted is read (``readlink``) or created
  (``symlinkat``), never resolved on the host;
* only directories, regular files and symbolic links are kept. A link whose target is absolute
  or climbs out of the workspace (``..`` past its top, read lexically) is dropped by
  :func:`pack` and refused by :func:`unpack`: a kept link is resolved only inside a sandbox, and a
  state never names a host path. Other entries (fifos, sockets, devices) are left out;
* :func:`unpack` reads only an uncompressed tar (no decompression bomb) and refuses, before
  writing anything for it, an entry with an absolute name, an empty, ``.`` or ``..`` component,
  a hard link or any other type, a parent that is not a directory it made itself, a name given
  twice, or sizes and counts beyond :class:`Bounds`. Modes keep the permission bits only
  (never set-id), with the owner's read and write (and search, for a directory) added so the
  sandbox's user can use what it gets back; owners are not restored: the files belong to
  whoever unpacks, which is the sandbox's user once mapped into it.

A refused archive raises ConfigError; a workspace that changed while it was packed (a process
still writing, where the caller could not freeze the sandbox) raises InfraError rather than
writing a torn copy.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandcell.errors import ConfigError, InfraError

MAX_DEPTH = 256
"""Directories nested deeper than this are not packed (the save fails): each level holds one
open descriptor while the walk is below it."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_HEADER_ROOM = 4096
"""Tar bytes allowed per entry beyond its contents (header, a long name's PAX record, padding)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """The most a workspace may hold: its size limit and its inode limit."""

    max_bytes: int
    max_entries: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """What :func:`pack` wrote, or :func:`unpack` made."""

    files: int
    directories: int
    links: int
    bytes: int
    left_out: int = 0
    """Entries :func:`pack` did not keep: links that point outside, fifos, sockets, devices."""


class _Count:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.files = self.directories = self.links = self.bytes = self.left_out = 0

    def entry(self, size: int, what: str) -> None:
        total = self.files + self.directories + self.links + 1
        if total > self.bounds.max_entries:
            raise _over(what, f"more than {self.bounds.max_entries} entries")
        if self.bytes + size > self.bounds.max_bytes:
            raise _over(what, f"more than {self.bounds.max_bytes} bytes")
        self.bytes += size

    def tally(self) -> Tally:
        return Tally(
            files=self.files,
            directories=self.directories,
            links=self.links,
            bytes=self.bytes,
            left_out=self.left_out,
        )


def _over(what: str, limit: str) -> ConfigError:
    return ConfigError(f"{what} holds {limit}, beyond the workspace's limit")


def link_stays_inside(parts: tuple[str, ...], target: str) -> bool:
    """Whether a link at ``parts`` (its path's components under the workspace) pointing at
    ``target`` names a place inside the workspace, read lexically."""
    if not target or "\0" in target or target.startswith("/"):
        return False
    depth = len(parts) - 1
    for comp in target.split("/"):
        if comp in ("", "."):
            continue
        depth += -1 if comp == ".." else 1
        if depth < 0:
            return False
    return True


# -- pack ---------------------------------------------------------------------------------


def pack(root: Path, archive: Path, *, bounds: Bounds) -> Tally:
    """Write the tree under ``root`` into ``archive`` (a new file, 0600), within ``bounds``."""
    count = _Count(bounds)
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise InfraError(f"could not read the workspace: {exc}") from exc
    try:
        device = os.fstat(root_fd).st_dev
        out_fd = os.open(archive, _NEW_FLAGS, 0o600)
        try:
            with (
                open(out_fd, "wb") as out,
                tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                _pack_dir(tar, root_fd, (), device, count)
        except BaseException:
            # No half archive left for a caller to mistake for a state.
            with contextlib.suppress(OSError):
                os.unlink(archive)
            raise
    except OSError as exc:
        raise InfraError(f"could not save the workspace: {exc}") from exc
    finally:
        os.close(root_fd)
    return count.tally()


def _pack_dir(
    tar: tarfile.TarFile, dir_fd: int, parts: tuple[str, ...], device: int, count: _Count
) -> None:
    if len(parts) > MAX_DEPTH:
        raise InfraError(f"the workspace nests directories deeper than {MAX_DEPTH}")
    with os.scandir(dir_fd) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        path = (*parts, name)
        shown = "/".join(path)
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
            if not link_stays_inside(path, target):
                count.left_out += 1
                continue
            count.entry(0, "the workspace")
            count.links += 1
            tar.addfile(_info(shown, st, tarfile.SYMTYPE, linkname=target))
        elif stat.S_ISDIR(st.st_mode) and st.st_dev == device:
            count.entry(0, "the workspace")
            count.directories += 1
            tar.addfile(_info(shown, st, tarfile.DIRTYPE))
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                _same(st, os.fstat(sub), shown)
                _pack_dir(tar, sub, path, device, count)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
            with open(fd, "rb") as f:
                now = os.fstat(fd)
                _same(st, now, shown)
                count.entry(now.st_size, "the workspace")
                count.files += 1
                try:
                    tar.addfile(_info(shown, now, tarfile.REGTYPE), f)
                except OSError as exc:
                    # tarfile's own "unexpected end of data": the file shrank under us.
                    raise InfraError(
                        f"the workspace changed while it was saved ({shown}: {exc})"
                    ) from exc
        else:
            count.left_out += 1


def _same(before: os.stat_result, after: os.stat_result, shown: str) -> None:
    if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino) or stat.S_IFMT(
        before.st_mode
    ) != stat.S_IFMT(after.st_mode):
        raise InfraError(f"the workspace changed while it was saved ({shown} was replaced)")


def _info(name: str, st: os.stat_result, kind: bytes, *, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode) & 0o777
    info.mtime = int(st.st_mtime)
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.linkname = linkname
    # Owners mean nothing elsewhere: the files belong to whoever unpacks them.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# -- unpack -------------------------------------------------------------------------------


def unpack(archive: Path, root: Path, *, bounds: Bounds) -> Tally:
    """Recreate the tree in ``archive`` (as :func:`pack` wrote it) under the directory ``root``,
    refusing anything the module's docstring lists; ``archive`` is only read."""
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"the saved workspace cannot be read: {exc}") from exc
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("the saved workspace is not a regular file")
        if st.st_size > bounds.max_bytes + (bounds.max_entries + 2) * _HEADER_ROOM:
            raise _over("the saved workspace", f"{st.st_size} bytes of archive")
        root_fd = os.open(root, _DIR_FLAGS)
        try:
            return _Unpacker(root_fd, bounds).run(f)
        finally:
            os.close(root_fd)


class _Unpacker:
    def __init__(self, root_fd: int, bounds: Bounds) -> None:
        self.root_fd = root_fd
        self.count = _Count(bounds)
        self.made: dict[tuple[str, ...], tuple[int, int]] = {(): (0o700, 0)}
        """Directories made here (path → mode, mtime): the only parents an entry may have."""
        self._cached: tuple[tuple[str, ...], int] | None = None

    def run(self, f: io.BufferedReader) -> Tally:
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for member in _members(tar):
                    self._one(tar, member)
            self._settle_directories()
        except tarfile.TarError as exc:
            raise ConfigError(f"the saved workspace is not a readable tar file: {exc}") from exc
        except FileExistsError as exc:
            raise ConfigError(
                f"the saved workspace names {exc.filename!r} twice, or something the new "
                "sandbox already holds (an input of that name)"
            ) from exc
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ConfigError(
                    "the saved workspace does not fit this sandbox's workspace limit"
                ) from exc
            raise InfraError(f"could not restore the workspace: {exc}") from exc
        finally:
            self._drop_cache()
        return self.count.tally()

    def _one(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = _parts(member.name)
        shown = "/".join(parts)
        if parts[:-1] not in self.made:
            raise ConfigError(f"the saved workspace's {shown!r} comes before its directory")
        if parts in self.made:
            raise ConfigError(f"the saved workspace names {shown!r} twice")
        name = parts[-1]
        what = "the saved workspace"
        if member.type == tarfile.DIRTYPE:
            self.count.entry(0, what)
            self.count.directories += 1
            os.mkdir(name, 0o700, dir_fd=self._dir(parts[:-1]))
            self.made[parts] = ((member.mode & 0o777) | 0o700, int(member.mtime))
        elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            self.count.entry(member.size, what)
            self.count.files += 1
            self._file(tar, member, parts)
        elif member.type == tarfile.SYMTYPE:
            if not link_stays_inside(parts, member.linkname):
                raise ConfigError(
                    f"the saved workspace's link {shown!r} points outside the workspace "
                    f"({member.linkname[:200]!r})"
                )
            self.count.entry(0, what)
            self.count.links += 1
            os.symlink(member.linkname, name, dir_fd=self._dir(parts[:-1]))
        else:
            raise ConfigError(
                f"the saved workspace's {shown!r} is neither a file, a directory nor a link"
            )

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        src = tar.extractfile(member)
        if src is None:
            raise ConfigError(f"the saved workspace's {'/'.join(parts)!r} has no contents")
        fd = os.open(parts[-1], _NEW_FLAGS, 0o600, dir_fd=self._dir(parts[:-1]))
        with open(fd, "wb") as out, src:
            left = member.size
            while left > 0:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    raise ConfigError(f"the saved workspace's {'/'.join(parts)!r} is cut short")
                out.write(chunk)
                left -= len(chunk)
            out.flush()
            os.fchmod(fd, (member.mode & 0o777) | 0o600)
            os.utime(fd, (int(member.mtime), int(member.mtime)))

    def _settle_directories(self) -> None:
        # Last and deepest first: a directory's time moves whenever an entry is made in it.
        for parts in sorted(self.made, key=len, reverse=True):
            if not parts:
                continue
            mode, mtime = self.made[parts]
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=self._dir(parts[:-1]))
            try:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)

    def _dir(self, parts: tuple[str, ...]) -> int:
        """An open descriptor of the directory ``parts`` made here, reached without following
        a link (the last one is kept: entries come directory by directory)."""
        if not parts:
            return self.root_fd
        if self._cached is not None and self._cached[0] == parts:
            return self._cached[1]
        self._drop_cache()
        fd = os.open(parts[0], _DIR_FLAGS, dir_fd=self.root_fd)
        try:
            for comp in parts[1:]:
                sub = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        self._cached = (parts, fd)
        return fd

    def _drop_cache(self) -> None:
        if self._cached is not None:
            with contextlib.suppress(OSError):
                os.close(self._cached[1])
            self._cached = None


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while True:
        member = tar.next()
        if member is None:
            return
        yield member


def _parts(name: str) -> tuple[str, ...]:
    """The components of an entry's name; ConfigError for one that could leave the root."""
    if not name or name.startswith("/") or "\0" in name:
        raise ConfigError(f"the saved workspace holds an entry named {name[:200]!r}")
    parts = tuple(name.rstrip("/").split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"the saved workspace holds an entry named {name[:200]!r}")
    return parts


__all__ = ["MAX_DEPTH", "Bounds", "Tally", "link_stays_inside", "pack", "unpack"]
