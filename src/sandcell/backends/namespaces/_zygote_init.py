"""sandcell zygote, part 3 of 4: C (the forked child: its new namespaces) and G (pid 1 of the
run: the fresh mounts, the request's limits and inputs, the program's process forked and
supervised, the status report, the workspace held for the exports). See ``_zygote.py``.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# In the template the parts run in one namespace (``_zygote.py`` executes them into its own, in
# the order base, program, init); imported as modules (tests, type checks) they import each other.
if __name__ != "__main__":
    from sandcell.backends.namespaces._zygote_base import (
        _FAILED,
        _NAMESPACES,
        _SANDBOX_UID,
        AT_FDCWD,
        AT_RECURSIVE,
        DONE_PAGE,
        IFF_RUNNING,
        IFF_UP,
        MOUNT_ATTR_NODEV,
        MOUNT_ATTR_NOSUID,
        MOUNT_ATTR_RDONLY,
        MOVE_MOUNT_F_EMPTY_PATH,
        MS_BIND,
        MS_NODEV,
        MS_NOEXEC,
        MS_NOSUID,
        MS_PRIVATE,
        MS_RDONLY,
        MS_REC,
        MS_REMOUNT,
        PR_SET_DUMPABLE,
        PR_SET_PDEATHSIG,
        SIOCGIFFLAGS,
        SIOCSIFFLAGS,
        SYS_MOUNT_SETATTR,
        SYS_MOVE_MOUNT,
        _check,
        _close_all_but,
        _drop_capabilities,
        _fail,
        _install_seccomp,
        _libc,
        _null_stdio,
        _recv,
        _report,
        _report_done,
        _send,
        _write,
    )
    from sandcell.backends.namespaces._zygote_program import _prepared_program, _restrict


def _child(sock: socket.socket, seccomp_program: bytes, boot: dict[str, Any]) -> dict[str, Any]:
    """C, then G; returns only in P, the program's process, with the request."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    _close_all_but({sock.fileno()})
    _null_stdio()
    try:
        _send(sock, b"C", creds=True)
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(_NAMESPACES), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{_SANDBOX_UID} {uid} 1")
        _write("/proc/self/gid_map", f"{_SANDBOX_UID} {gid} 1")
        g = os.fork()
    except Exception as exc:
        _fail(f"namespaces: {exc}")
    if g:
        # C's only job was to make the namespaces; waiting on G would keep a third copy of the
        # template's image per sandbox (about 1.3 MiB of private pages and 0.2 MiB of page
        # tables). G is reparented to the template, pid 1 of the namespace every run is in,
        # which reaps it (SIGCHLD ignored) and whose end kills it with everything else there.
        os._exit(0)
    return _init(sock, seccomp_program, boot)


# -- G: pid 1 of the run ---------------------------------------------------------------------


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _tmpfs(target: str, opts: str) -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def _read_only(target: str, extra: int = 0) -> None:
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra, None)


def _loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP | IFF_RUNNING))
    finally:
        s.close()


def _mounts_below(top: str, table: str | None = None) -> list[str]:
    """The outermost mount points strictly below ``top``, from this mount namespace's table
    (``/proc/self/mountinfo``, or ``table`` given in its format)."""
    if table is None:
        with open("/proc/self/mountinfo") as f:
            table = f.read()
    points: list[str] = []
    for line in table.splitlines():
        # Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
        point = line.split(" ", 5)[4]
        for esc, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n")):
            point = point.replace(esc, char)
        point = point.replace("\\134", "\\")
        if point.startswith(top + "/"):
            points.append(point)
    points.sort()
    outer: list[str] = []
    for point in points:
        if not any(point.startswith(o + "/") or point == o for o in outer):
            outer.append(point)
    return outer


def _prepare() -> None:
    """Everything of a fresh sandbox that does not depend on the request."""
    # No parent-death signal: the parent is C, which exits at once. The kernel kills this
    # process when the template ends, as pid 1 of an enclosing pid namespace (--as-pid-1).
    # Nothing mounted here may ever propagate back into the template.
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    # What bwrap --disable-userns does: no user namespace below this one.
    _write("/proc/sys/user/max_user_namespaces", "0")
    for sub in ("sys", "sysrq-trigger", "irq", "bus"):
        path = f"/proc/{sub}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC, None)
            _read_only(path, MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The runtime may live under /tmp (a venv in a checkout there): its read-only mounts are
    # held by descriptor while the run's own /tmp covers them, then bound back on top.
    kept = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in _mounts_below("/tmp")]
    _tmpfs("/tmp", "mode=1777")
    for path, fd in kept:
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        _read_only(path, MS_NOSUID | MS_NODEV)
        os.close(fd)
    _tmpfs("/dev/shm", "mode=1777")
    _tmpfs("/sandbox", "mode=755")
    # The workspace again at the home other sandboxes use (layout.SANDBOX_HOME): the same
    # tmpfs, so the request's remount of /sandbox sizes both.
    _mount("/sandbox", "/home/user", None, MS_BIND, None)
    _tmpfs("/sandcell", "mode=755")
    # Mounted now, not with the request: a Landlock rule applied before the request (a pooled
    # program's) must be on this tmpfs's root, as rules on a mount point are hidden by the mount.
    _tmpfs("/inputs", "mode=755,size=65536")
    _loopback_up()


# run_sockets.SANDBOX_DIR as reached through the template's /run symlink (template.py).
_SOCKETS_DIR = "/sandcell/run/sandcell"


def _move_tree(tree: int, path: str) -> None:
    """Move a detached mount tree the host cloned (``_trees.py``) onto ``path``, read-only."""
    _check(
        _libc.syscall(
            ctypes.c_long(SYS_MOVE_MOUNT),
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        ),
        f"move_mount {path}",
    )
    attr = struct.pack("=QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    _check(
        _libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR),
            ctypes.c_int(AT_FDCWD),
            path.encode(),
            ctypes.c_uint(AT_RECURSIVE),
            attr,
            ctypes.c_size_t(len(attr)),
        ),
        f"mount_setattr {path}",
    )
    os.close(tree)


def _apply_request(req: dict[str, Any], trees: list[int]) -> None:
    limits = req["limits"]
    # /tmp and /dev/shm share the private-/tmp size (each), and both have an inode cap: without
    # one a tmpfs takes half the host's memory, which only a cgroup would bound.
    small = f"size={int(limits['tmp_bytes'])},nr_inodes={int(limits['workspace_inodes'])}"
    _mount(None, "/tmp", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, small)
    _mount(None, "/dev/shm", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, small)
    _mount(
        None,
        "/sandbox",
        None,
        MS_REMOUNT | MS_NOSUID | MS_NODEV,
        f"size={int(limits['workspace_bytes'])},nr_inodes={int(limits['workspace_inodes'])}",
    )
    script = "/sandcell/" + req["script"]
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        data = req["code"].encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    if req.get("sockets"):
        # The run's egress proxy and tool gateway (``outside.py``): /run/sandcell through the
        # template's /run symlink, inside this tmpfs, whose root holds the program's read-only
        # Landlock rule (a pooled program's, applied before this request, included).
        os.makedirs(_SOCKETS_DIR, 0o755)
        _move_tree(trees[-1], _SOCKETS_DIR)
    _read_only("/sandcell", MS_NOSUID | MS_NODEV)
    names = req["inputs"]
    if len(trees) != len(names) + (1 if req.get("sockets") else 0):
        raise ValueError(f"{len(trees)} mount trees for {len(names)} inputs")
    for name, tree in zip(names, trees, strict=False):
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"bad input name {name!r}")
        path = f"/inputs/{name}"
        if req["input_dirs"].get(name):
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))
        _move_tree(tree, path)
        os.symlink(path, f"/sandbox/{name}")
    _read_only("/inputs", MS_NOSUID | MS_NODEV)


def _start_bridge(req: dict[str, Any], seccomp_program: bytes) -> None:
    """The egress bridge (``req["bridge"]``: its script and arguments), in a child of pid 1 that
    holds what the program will hold (the run's rlimits, no capabilities, the full seccomp
    filter, not dumpable) and none of pid 1's descriptors; returns once it listens (the one line
    it prints). It runs in this interpreter, a copy of the template's: an interpreter of its
    own would cost some 20 ms per run. Outside the program's Landlock domain, whose signal
    scope keeps the program from stopping it; in the run's pid namespace and cgroup, so it
    ends with the run."""
    bridge = req.get("bridge")
    if not bridge:
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = _FAILED
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
            # Its line goes to pid 1, never into the program's output.
            os.dup2(write_end, 1)
            _close_all_but(set())
            for name, soft, hard, relative in req["rlimits"]:
                base = 0
                if relative:  # the template's own mappings are not the run's to count
                    with open("/proc/self/statm") as f:
                        base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
                resource.setrlimit(getattr(resource, name), (soft + base, hard + base))
            _drop_capabilities()
            _install_seccomp(seccomp_program)
            with open(bridge[0], "rb") as f:
                source = f.read()
            sys.argv = list(bridge)
            ns: dict[str, Any] = {"__name__": "__main__", "__file__": bridge[0]}
            ns["__builtins__"] = sys.modules["builtins"]
            exec(compile(source, bridge[0], "exec", dont_inherit=True), ns)  # noqa: S102
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            try:  # noqa: SIM105
                os.write(2, f"sandcell-zygote: egress bridge: {exc}\n".encode())
            except OSError:
                pass
        os._exit(status)
    os.close(write_end)
    line = b""
    try:
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([read_end], [], [], remaining)[0]:
                break
            chunk = os.read(read_end, 64)
            if not chunk:
                break
            line += chunk
    finally:
        os.close(read_end)
    if not line.strip().isdigit():
        raise OSError(f"the egress bridge did not start (it said {line!r})")


def _init(sock: socket.socket, seccomp_program: bytes, boot: dict[str, Any]) -> dict[str, Any]:
    # As pid 1 with no handler, the kernel drops every signal sent from inside the namespace
    # that would end or interrupt it (Python's own SIGINT handler would let the program raise
    # KeyboardInterrupt in its supervisor); the program gets Python's handler back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        _prepare()
        _send(sock, b"R", creds=True)
        body, fds = _recv(sock, 64)
    except Exception as exc:
        _fail(f"setup: {exc}")
    if not body:
        os._exit(0)  # the host let this sandbox go unused
    req = json.loads(body)
    if "arm" in req:
        return _armed(sock, req["arm"], seccomp_program, boot)
    stdin, stdout, stderr, status = fds[:4]
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    try:
        _apply_request(req, fds[4:])
        _start_bridge(req, seccomp_program)
    except Exception as exc:
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"request: {exc}")
    watched = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    # Not dumpable before the fork, so that the program (same uid) can never open pid 1's
    # /proc/1/mem or its descriptors; the program's own copy is made dumpable again.
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    page = mmap.mmap(-1, DONE_PAGE) if req.get("quiesce") else None
    program = os.fork()
    if program == 0:
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        # The descriptor is closed with every other one below; the object must not close its
        # number again later, when it may be the program's.
        sock.detach()
        _restrict(req, status, seccomp_program, boot)
        request: dict[str, Any] = req
        if page is not None:
            request["_quiesce"] = (os.getpid(), page)
        return request
    try:
        # pid 1 needs no privilege from here on: it holds what the program holds, no more.
        _drop_capabilities()
        _install_seccomp(seccomp_program)
    except Exception as exc:
        os.kill(program, signal.SIGKILL)
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"supervisor: {exc}")
    _supervise(sock, program, status, watched, page)


def _armed(
    sock: socket.socket, arm: dict[str, Any], seccomp_program: bytes, boot: dict[str, Any]
) -> dict[str, Any]:
    """A pooled sandbox: the host has put G in the run's cgroup; P is forked and restricted now,
    before any request exists, and waits for it. Returns only in P, with the request."""
    watched = {signal.SIGCHLD, signal.SIGTERM}
    try:
        g_end, p_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
        # Shared with the program's process before any request: where it says it ended.
        page = mmap.mmap(-1, DONE_PAGE)
        program = os.fork()
    except Exception as exc:
        _fail(f"arm: {exc}")
    if program == 0:
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        # Closed with every other inherited descriptor in _prepared_program.
        sock.detach()
        g_end.detach()
        return _prepared_program(p_end, arm, seccomp_program, boot, page)
    p_end.close()
    try:
        ready = g_end.recv(1)
    except OSError:
        ready = b""
    if ready != b"K":
        os.kill(program, signal.SIGKILL)
        _fail("the program's process failed to restrict itself")
    try:
        _send(sock, b"P")
        body, fds = _recv(sock, 64)
    except Exception as exc:
        os.kill(program, signal.SIGKILL)
        _fail(f"armed: {exc}")
    if not body:
        os.kill(program, signal.SIGKILL)
        os._exit(0)  # the host let this sandbox go unused
    req = json.loads(body)
    stdin, stdout, stderr, status = fds[:4]
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    try:
        _apply_request(req, fds[4:])
        _start_bridge(req, seccomp_program)
        _limit(program, req["rlimits"])
        # Nothing privileged is left to do: pid 1 drops what the program holds before the
        # program gets its first byte of the request.
        _drop_capabilities()
        _install_seccomp(seccomp_program)
        # The program's process's part, encoded by the host (``warm_request.for_armed``).
        _send(g_end, req["program"].encode(), [0, 1, 2, status])
        g_end.close()
    except Exception as exc:
        os.kill(program, signal.SIGKILL)
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"request: {exc}")
    _supervise(sock, program, status, watched, page if req.get("quiesce") else None)


def _limit(program: int, rlimits: list[Any]) -> None:
    """The run's rlimits on the waiting program (pid 1 may: same uid, same user namespace)."""
    for name, soft, hard, relative in rlimits:
        # The address space the template already maps is not the program's to count.
        base = 0
        if relative:
            with open(f"/proc/{program}/statm") as f:
                base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.prlimit(program, getattr(resource, name), (soft + base, hard + base))


def _supervise(
    sock: socket.socket,
    program: int,
    status_fd: int,
    watched: set[signal.Signals],
    page: Any = None,
) -> NoReturn:
    """Wait for the program, end every other process of the run, report, hold the workspace.

    With a shared ``page`` (the host freezes the run's cgroup) a program's process that stopped
    itself after writing its exit code there is reported at once (``D``); the host then freezes
    the run and ends it, and this loop only sees the kill."""
    _null_stdio()
    _close_all_but({sock.fileno(), status_fd})
    status: int | None = None
    stops = os.WUNTRACED if page is not None else 0
    done = False
    while status is None:
        info = signal.sigwaitinfo(watched)
        # The host's stop. Any SIGTERM ends the run: the sender is not to be trusted (it can be
        # forged), a program flooding SIGTERM would merge the host's into its own, and a program
        # may end its own run anyway.
        if info.si_signo == signal.SIGTERM:
            os.kill(-1, signal.SIGKILL)
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG | stops)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid != program:
                continue
            if not os.WIFSTOPPED(st):
                status = st
            elif not done:
                done = _report_done(status_fd, page)
    # Nothing of the run outlives its program: the exports are read from a quiet workspace.
    try:  # noqa: SIM105 - contextlib is not worth importing in every run
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
    _report(status_fd, status, cpu_ms, usage.ru_maxrss * 1024)
    # Hold the mount namespace (the workspace) until the host has read the exports.
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass
    os._exit(0)
