"""sandcell zygote, part 1 of 4: what every process of a warm run uses (constants, libc calls,
the framed messages on the control sockets, descriptor hygiene, the capability drop, the seccomp
install and pid 1's status report). See ``_zygote.py`` for the whole; stdlib only, like it.
"""

from __future__ import annotations

import array
import ctypes
import os
import socket
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

_FAILED = 125
_SANDBOX_UID = 1000

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_NAMESPACES = (
    CLONE_NEWUSER
    | CLONE_NEWNS
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWIPC
    | CLONE_NEWUTS
    | CLONE_NEWCGROUP
)

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFF_RUNNING = 0x40

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _fail(message: str) -> NoReturn:
    try:  # noqa: SIM105 - stderr may be gone; the exit status still tells
        os.write(2, f"sandcell-zygote: {message}\n".encode("utf-8", "backslashreplace"))
    except OSError:
        pass
    os._exit(_FAILED)


# -- messages --------------------------------------------------------------------------------


def _send(sock: socket.socket, data: bytes, fds: list[int] = (), creds: bool = False) -> None:  # type: ignore[assignment]
    anc = []
    if fds:
        anc.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes()))
    if creds:
        # The kernel checks these against the sender and translates the pid into the
        # receiver's pid namespace: the host learns the host pid of this process.
        anc.append(
            (
                socket.SOL_SOCKET,
                socket.SCM_CREDENTIALS,
                struct.pack("=iII", os.getpid(), os.getuid(), os.getgid()),
            )
        )
    sock.sendmsg([struct.pack("=I", len(data)) + data], anc)


def _recv(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int]]:
    """One length-prefixed message and the descriptors that came with its first byte."""
    head, anc, _, _ = sock.recvmsg(4, socket.CMSG_SPACE(4 * max_fds) if max_fds else 0)
    fds: list[int] = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - len(data) % 4])
            fds.extend(a)
    if not head:
        return b"", fds
    while len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            raise EOFError("short message header")
        head += more
    (size,) = struct.unpack("=I", head)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            raise EOFError("short message")
        body += chunk
    return bytes(body), fds


def _close_all_but(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:  # noqa: SIM105
                os.close(fd)
            except OSError:
                pass


def _null_stdio() -> None:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _report(status_fd: int, status: int, cpu_ms: float, maxrss: int) -> None:
    try:
        os.write(status_fd, f"W{status} {cpu_ms:.3f} {maxrss}\n".encode())
        os.close(status_fd)
    except OSError:
        pass


# Filled once in the template (``_prepare_calls``): the same in every process forked from it, and
# a run's pid 1 and program then drop and filter without opening a file or building a buffer on
# the request's path (each first touch of an object there copies a page of the template's image).
_CAP_LAST: list[int] = []
_FILTERS: dict[bytes, tuple[Any, bytes]] = {}


def _prepare_calls(seccomp_program: bytes) -> None:
    """What the capability drop and the seccomp install need, made before any fork."""
    _cap_last()
    _seccomp_args(seccomp_program)


def _cap_last() -> int:
    if not _CAP_LAST:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            _CAP_LAST.append(int(f.read()))
    return _CAP_LAST[0]


_CAP_HEADER = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
_CAP_DATA = bytes(24)  # two struct __user_cap_data_struct, all zero


def _drop_capabilities() -> None:
    prctl = _libc.prctl
    for cap in range(_cap_last() + 1):
        if prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            _check(-1, f"drop capability {cap}")  # the message only where it is needed
    _check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    _check(_libc.capset(_CAP_HEADER, _CAP_DATA), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _seccomp_args(program: bytes) -> bytes:
    """The ``struct sock_fprog`` of ``program``, whose buffer lives as long as this process."""
    made = _FILTERS.get(program)
    if made is None:
        buf = ctypes.create_string_buffer(program, len(program))
        # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
        made = (buf, struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf)))
        _FILTERS[program] = made
    return made[1]


def _install_seccomp(program: bytes) -> None:
    fprog = _seccomp_args(program)
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0),
        "seccomp",
    )


# The program's process ends a run by writing its exit code behind this tag into the page it
# shares with pid 1, then stopping itself (``_zygote_program._end_quietly``).
DONE_TAG = 0x53434431  # "SCD1"
DONE_PAGE = 8


def _report_done(status_fd: int, page: Any) -> bool:
    """pid 1's early report of a program that ended and stopped itself: ``D<exit code>``, from
    the page the program's process shares with it (what the program claims, as an exit status
    is). False when the page holds no claim (a stop for another reason)."""
    try:
        tag, code = struct.unpack("=II", bytes(page[:DONE_PAGE]))
    except (ValueError, struct.error):
        return False
    if tag != DONE_TAG:
        return False
    try:
        os.write(status_fd, f"D{code & 0xFF}\n".encode())
    except OSError:
        return False
    return True
