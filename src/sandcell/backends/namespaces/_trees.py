"""Detached mount trees of host paths, for the inputs of warm-start runs.

A warm-started run lives in mount namespaces made from the template's, where no host path is
visible; a bind mount from a descriptor of another mount namespace is refused by the kernel. A
detached copy of the path's mount tree (``open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)``) is not
tied to a namespace: the run's pid 1 moves it in with ``move_mount`` and makes it read-only.

As root the supervisor clones the trees itself. An ordinary user may not clone host mounts, so
this module also runs as a short helper (``python -I -S _trees.py SOCK_FD PATH...``) that makes
a user and mount namespace of its own (a copy of the host's, mapping only its uid), clones the
paths there and sends the descriptors back; the helper sees the files exactly as the user does.

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
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def open_trees(paths: list[str]) -> list[int]:
    """A detached, recursive copy of the mount tree at each path (close-on-exec descriptors)."""
    fds: list[int] = []
    try:
        for path in paths:
            fd = _libc.syscall(
                ctypes.c_long(SYS_OPEN_TREE),
                ctypes.c_int(AT_FDCWD),
                os.fsencode(path),
                ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC),
            )
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
            fds.append(fd)
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
        fds = open_trees(argv[1:])
    except OSError as exc:
        sock.sendall(f"E{exc}".encode())
        return 1
    sock.sendmsg([b"K"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
