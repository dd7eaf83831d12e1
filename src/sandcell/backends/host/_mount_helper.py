"""Workspace holder for ordinary users: a size-capped tmpfs without host privileges.

Usage (started by the launcher, never by hand)::

    python -I -S _mount_helper.py WORKSPACE SIZE INODES RESULT_FD HOLD_FD KEEP_FDS \
        [--overlay TARGET LAYER LAYER]... -- BWRAP_ARGV...

An ordinary user cannot mount a tmpfs on the host, but can in a user and mount namespace of its
own. This helper makes one (mapping only its own uid), mounts the workspace tmpfs at WORKSPACE
there with the read-only overlays of the run's neutral sources (``neutral_sources.py``: layers
named by ``/proc/self/fd/N``, so mountinfo shows no host path), runs bwrap inside it, and
reports bwrap's wait status and resource usage on RESULT_FD. It
then keeps the namespace, and so the workspace, alive until HOLD_FD reaches end-of-file: meanwhile
the supervisor exports files through ``/proc/<helper pid>/root``. No sandboxed process is alive by
then (bwrap's pid namespace is gone), so nothing can change the workspace during the export.

With WORKSPACE ``-`` and RESULT_FD ``-`` (the warm-start template) it mounts only the overlays
and then becomes bwrap: nothing to report, nothing to hold.

Standalone on purpose (stdlib only): it must start fast and must not depend on sandcell's import
path. Failures exit 125 with a ``sandcell-helper:`` line on stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SIGKILL = 9


def _fail(message: str) -> None:
    os.write(2, f"sandcell-helper: {message}\n".encode())
    os._exit(125)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _overlay(libc: ctypes.CDLL, target: str, layers: list[str]) -> None:
    """A read-only overlay of ``layers`` on ``target`` (see ``neutral_sources.py``); a plain bind
    of the host directory where the kernel refuses the overlay."""
    fds = [os.open(layer, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for layer in layers]
    try:
        lower = ":".join(f"/proc/self/fd/{fd}" for fd in fds)
        opts = f"lowerdir={lower},userxattr".encode()
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        if libc.mount(b"sandcell", target.encode(), b"overlay", flags, opts) == 0:
            return
    finally:
        for fd in fds:
            os.close(fd)
    host = layers[-1] if layers[-1] != target else layers[0]
    if libc.mount(host.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        _fail(f"bind {host} on {target}: {os.strerror(ctypes.get_errno())}")


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    workspace, size, inodes, result_fd, hold_fd, keep = argv[:6]
    overlays: list[tuple[str, list[str]]] = []
    rest = argv[6:sep]
    while rest:
        if rest[0] != "--overlay" or len(rest) < 4:
            _fail(f"bad arguments {rest!r}")
        overlays.append((rest[1], rest[2:4]))
        rest = rest[4:]
    bwrap_argv = argv[sep + 1 :]
    keep_fds = [int(x) for x in keep.split(",") if x]
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        _fail(f"unshare: {os.strerror(ctypes.get_errno())}")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:
        _fail(f"uid map: {exc}")
    # Private propagation: the workspace mount must never appear in the host's namespace.
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _fail(f"make-rprivate: {os.strerror(ctypes.get_errno())}")
    if workspace != "-":
        opts = f"size={size},nr_inodes={inodes},mode=755".encode()
        if libc.mount(b"tmpfs", workspace.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            _fail(f"mount tmpfs on {workspace}: {os.strerror(ctypes.get_errno())}")
    for target, layers in overlays:
        try:
            _overlay(libc, target, layers)
        except OSError as exc:
            _fail(f"overlay on {target}: {exc}")
    if result_fd == "-":
        try:
            os.execv(bwrap_argv[0], [os.path.basename(bwrap_argv[0]), *bwrap_argv[1:]])
        except OSError as exc:
            _fail(f"exec {bwrap_argv[0]}: {exc}")

    # Die with the supervisor. Without this, a supervisor killed by SIGKILL would leave this
    # helper waiting on bwrap, bwrap (whose --die-with-parent is tied to this helper) and the
    # sandboxed program running with no wall-time limit. Armed after the unshare, a credential
    # change. The supervisor never writes to HOLD_FD, so it is readable only at end-of-file: the
    # supervisor died before the death signal was armed.
    if libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
    if select.select([int(hold_fd)], [], [], 0)[0]:
        _fail("the supervisor is gone")

    # Subreaper: the sandbox's init is orphaned when bwrap exits; reaping it here (and everything
    # it reaped) makes the reported CPU time cover the whole process tree, not just bwrap.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        os.close(int(result_fd))
        os.close(int(hold_fd))
        try:
            # By name only: bwrap's argv is the sandbox's /proc/1/cmdline.
            os.execv(bwrap_argv[0], [os.path.basename(bwrap_argv[0]), *bwrap_argv[1:]])
        except OSError as exc:
            _fail(f"exec {bwrap_argv[0]}: {exc}")
    # Drop every descriptor bwrap shares with the supervisor, so end-of-file on the sandbox's
    # output means the sandbox, not this helper, is done.
    for fd in (0, 1, 2, *keep_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    status, cpu_ms, maxrss = 0, 0.0, 0
    while True:
        try:
            child, child_status, rusage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if child == pid:
            status = child_status
        cpu_ms += (rusage.ru_utime + rusage.ru_stime) * 1000
        maxrss = max(maxrss, rusage.ru_maxrss * 1024)
    os.write(int(result_fd), f"{status} {cpu_ms:.3f} {maxrss}\n".encode())
    os.close(int(result_fd))
    while os.read(int(hold_fd), 4096):
        pass
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
