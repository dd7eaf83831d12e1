"""Detached mount trees of host paths, for the inputs of warm-start runs.

A warm-started run lives in mount namespaces made from the template's, where no host path is
visible; a bind mount from a descriptor of another mount namespace is refused by the kernel. A
detached copy of the path's mount tree (``open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)``) is not
tied to a namespace: the run's pid 1 moves it in with ``move_mount`` and makes it read-only.

The tree is cloned from a read-only overlay of the input (of its parent directory for a file,
the clone then holding only the file), mounted for the moment of the clone on a scratch
directory: mountinfo then shows the run ``/`` (or ``/<file name>``) and layers named
``/proc/self/fd/N`` where a clone of the host path itself would show that path
(``neutral_sources.py`` explains why). Where the kernel refuses the overlay, the host path is
cloned as it is, and shows.

As root the supervisor clones the trees itself. An ordinary user may not clone host mounts, so
this module also runs as a helper
(``python -I -S _trees.py SOCK_FD SCRATCH EMPTY PATH... [--plain PATH...]``)
that makes a user and mount namespace of its own (a copy of the host's, mapping only its uid),
clones the paths there and sends the descriptors back; the helper sees the files exactly as the
user does.

Standalone on purpose (stdlib only), so the helper starts fast.

Security limitations: the copy is recursive, like bwrap's ``--ro-bind``: mounts below an input
path come with it (all of them made read-only, nosuid and nodev by the run's pid 1). Symlinks in
the path are followed when the tree is cloned, as they are for a cold run's bind mount.
"""

from __future__ import annotations

import array
import ctypes
import os
import socket
import sys

SYS_OPEN_TREE = 428
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
PLAIN = "--plain"
"""On the helper's command line: the paths after it are cloned plainly (``open_trees``)."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _clone(path: str) -> int:
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPEN_TREE),
        ctypes.c_int(AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
    return int(fd)


def _overlay(lower: str, empty: str, target: str) -> bool:
    """A read-only overlay of ``lower`` (and the empty second layer it needs) on ``target``."""
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in (lower, empty)]
    try:
        opts = f"lowerdir=/proc/self/fd/{fds[0]}:/proc/self/fd/{fds[1]},userxattr".encode()
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        return bool(_libc.mount(b"sandcell", os.fsencode(target), b"overlay", flags, opts) == 0)
    finally:
        for fd in fds:
            os.close(fd)


def _neutral_clone(path: str, target: str, empty: str) -> int:
    real = os.path.realpath(path)
    is_dir = os.path.isdir(real)
    os.mkdir(target, 0o700)
    try:
        if not _overlay(real if is_dir else os.path.dirname(real), empty, target):
            return _clone(path)
        try:
            return _clone(target if is_dir else os.path.join(target, os.path.basename(real)))
        finally:
            # The clone keeps the overlay alive; nothing stays mounted on the scratch directory.
            _libc.umount2(os.fsencode(target), MNT_DETACH)
    finally:
        os.rmdir(target)


def open_trees(
    paths: list[str], scratch: str, empty: str, plain: tuple[str, ...] | list[str] = ()
) -> list[int]:
    """A detached, read-only-sourced copy of each path (close-on-exec descriptors), cloned
    through an overlay mounted for the moment on a directory made under ``scratch``. ``empty``:
    an empty directory that outlives the runs (the overlay's second layer: the clone reads it
    for as long as the run lives, and a removed layer would show every directory empty).
    ``plain``: directories cloned as they are, after ``paths`` (a run's socket directory: a
    Unix socket reached through an overlay refuses connections)."""
    fds: list[int] = []
    try:
        for i, path in enumerate(paths):
            fds.append(_neutral_clone(path, os.path.join(scratch, str(i)), empty))
        for path in plain:
            fds.append(_clone(path))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    uid, gid = os.getuid(), os.getgid()
    try:
        if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        paths = argv[3:]
        # PATH... [--plain PATH...]
        cut = paths.index(PLAIN) if PLAIN in paths else len(paths)
        fds = open_trees(paths[:cut], argv[1], argv[2], paths[cut + 1 :])
    except OSError as exc:
        sock.sendall(f"E{exc}".encode())
        return 1
    sock.sendmsg([b"K"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
