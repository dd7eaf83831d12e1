"""The guest kernel's calls the agent makes itself: mounts, small files, the console, reaping.

Plain descriptors, not Python's text files, where the agent writes kernel files: under TCG each
layer of those costs.
"""

from __future__ import annotations

import ctypes
import os

UID = GID = 1000
"""The program's user and group."""
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC = 4096, 16384
RB_POWER_OFF = 0x4321FEDC

libc = ctypes.CDLL(None, use_errno=True)


def log(msg: str) -> None:
    """A line on the guest's console (the host quotes it when a boot fails)."""
    try:
        with open("/dev/console", "w") as f:
            f.write(f"sandcell-agent: {msg}\n")
    except OSError:
        pass


def mount(src: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    if libc.mount(src.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def tmpfs(target: str, size: int, inodes: int, mode: int, uid: int = 0) -> None:
    opts = f"size={size},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid}"
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def remount_ro(target: str) -> None:
    mount("none", target, "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_file(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


def open_dir_nofollow(path: str) -> int:
    """A descriptor of the directory ``path`` (absolute), no component followed if a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open("/", flags)
    try:
        for name in [p for p in path.split("/") if p]:
            nxt = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def reap() -> list[tuple[int, int]]:
    """(pid, status) of every child that has exited, reaped (pid 1 reaps every orphan)."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, st))
