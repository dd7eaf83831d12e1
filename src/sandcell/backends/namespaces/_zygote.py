"""sandcell zygote: the template of warm starts, and the isolation of every run forked from it.

Usage (inside the template's bubblewrap sandbox, started by ``template.py``, never by hand)::

    python -I /sandcell/zygote.pyc CONTROL_FD PRELOAD

The template process (T) imports the modules named in PRELOAD (comma-separated), checks that it is
single-threaded, says ``R`` on the control socket (with its pid, which the kernel translates for
the host through SCM_CREDENTIALS) and then only ever waits for one of two requests:

* ``F`` + a socket descriptor: fork a child for one run; the socket goes to the child and T
  closes its copy. T never sees the request: code, environment and inputs go straight from the
  host to the child, so T never touches an untrusted byte;
* ``S``: answer with its state (thread count, sys.modules digest) so the host can check it is
  unchanged.

End of file on the control socket (the host closed it or died) ends T, and with it bwrap and the
whole pid namespace of the template, every run included.

A child isolates itself as if it were a fresh sandbox before it reads a byte of the request:

1. C (the forked child) sends its own credentials, closes everything but its socket, and
   unshares user, mount, pid, network, IPC, UTS and cgroup namespaces; its uid 1000 maps to the
   template's. C then only forks G and waits for it.
2. G is pid 1 of the new pid namespace: it makes every mount private, mounts its own ``/proc``
   (sys, sysrq-trigger, irq and bus read-only, no nested user namespaces), fresh tmpfs at
   ``/tmp``, ``/sandbox``, ``/dev/shm``, ``/inputs`` and ``/sandcell``, brings up loopback, and
   says ``R`` with its credentials: the host learns G's pid and moves G into the run's cgroup.
   A pooled sandbox is then *armed* (``{"arm": ...}``, before any request exists): G forks P
   at once, P applies every restriction of step 5 that does not depend on the request (caps,
   no_new_privs, Landlock with ``/inputs`` always readable, the full seccomp filter) and waits;
   G says ``P`` to the host and waits too.
3. The request arrives: limits (tmpfs sizes are remounted), environment, the program and its
   descriptors (stdin, stdout, stderr, status), input trees cloned by the host (``open_tree``)
   and moved in read-only under ``/inputs``.
4. G forks P (an armed G has forked it already: it sets P's rlimits with ``prlimit``, drops its
   own capabilities and installs the full filter on itself, and only then hands P the
   environment and stdio) and supervises it like the boot's parent does (trusted, idle,
   reports the raw wait status); at the end it kills everything else in its pid namespace,
   reports status and CPU time, and holds the mount namespace until the host has read the
   exports.
5. P replaces the environment, sets the run's rlimits, drops every capability (bounding set
   included), sets no_new_privs, applies Landlock and the cold path's full seccomp filter, closes
   every descriptor but 0-2, reseeds the random generators, says "started" and runs the program
   in this interpreter as ``__main__`` (the boot's ``_run_python``, as a notebook cell of the
   display module when the run captures rich outputs): the preloaded modules are already in
   ``sys.modules``.

Standalone on purpose (stdlib only): it is copied into the template's sandbox. Failures of a
child exit 125 with a ``sandcell-zygote:`` line on the run's stderr.

Security limitations: every run of a template shares the template's memory image as it was
before the fork (copy-on-write): module state, the hash secret of ``str`` (``PYTHONHASHSEED``)
and the address-space layout (ASLR is per exec, not per fork). Nothing of another run is in it,
but a run can learn the layout a sibling run has. The template's own sandbox allows what the
setup needs (unshare, mount); the program never runs under that filter alone.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import socket
import struct
import sys

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


# -- the template ----------------------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _state() -> dict[str, Any]:
    import hashlib

    names = "\n".join(sorted(sys.modules)).encode()
    return {
        "pid": os.getpid(),
        "threads": _threads(),
        "modules": len(sys.modules),
        "modules_sha256": hashlib.sha256(names).hexdigest(),
    }


def _template(control_fd: int, preload: list[str]) -> tuple[socket.socket, bytes, dict[str, Any]]:
    """Run the template loop; returns only in a forked child: its socket, the run's seccomp
    program and the boot's functions (with the display module as ``_display``)."""
    control = socket.socket(fileno=control_fd)
    with open("/sandcell/seccomp.bpf", "rb") as f:
        seccomp_program = f.read()
    boot = _load_boot("/sandcell/boot.pyc")
    # Loaded once here (trusted code): a run that displays finds it in its copy of the image.
    boot["_display"] = boot["_load_display"]("/sandcell/display.pyc")
    # The boot's C calls (Landlock, compiling the program) built once here, not in every run.
    boot["_ffi"]()
    for name in preload:
        __import__(name)
    # Frozen: the template's objects stay out of every child's garbage collections, whose
    # reference-count writes would otherwise copy their pages into each run.
    import gc

    gc.collect()
    gc.freeze()
    # Children that exit are reaped by the kernel: the template waits for nothing.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    threads = _threads()
    if threads != 1:
        _send(control, json.dumps({"error": f"{threads} threads after the preload"}).encode())
        os._exit(_FAILED)
    _send(control, json.dumps({"ready": _state(), "preloaded": preload}).encode(), creds=True)
    while True:
        try:
            msg, fds = _recv(control, 1)
        except (OSError, EOFError):
            os._exit(0)
        if not msg:
            os._exit(0)  # the host is gone
        if msg == b"S":
            _send(control, json.dumps(_state()).encode())
            continue
        if msg != b"F" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        # A fork with a second thread alive would copy a lock some thread holds: refuse.
        if _threads() != 1:
            os.close(fds[0])
            os._exit(_FAILED)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            control.close()
            return socket.socket(fileno=fds[0]), seccomp_program, boot
        os.close(fds[0])


def _load_boot(path: str) -> dict[str, Any]:
    """The boot's functions, from its compiled file, without putting it on sys.path."""
    import marshal

    with open(path, "rb") as f:
        code = marshal.loads(f.read()[16:])  # noqa: S302 - the host compiled it for us
    ns: dict[str, Any] = {"__name__": "_sandcell_boot", "__builtins__": __builtins__}
    exec(code, ns)  # noqa: S102 - sandcell's own boot, compiled by the host
    return ns


# -- one child: C ----------------------------------------------------------------------------


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
        sock.close()
        _, status = os.waitpid(g, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
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
    import fcntl

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
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
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
    _tmpfs("/sandcell", "mode=755")
    # Mounted now, not with the request: a Landlock rule applied before the request (a pooled
    # program's) must be on this tmpfs's root, as rules on a mount point are hidden by the mount.
    _tmpfs("/inputs", "mode=755,size=65536")
    _loopback_up()


def _apply_request(req: dict[str, Any], input_fds: list[int]) -> None:
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
    _read_only("/sandcell", MS_NOSUID | MS_NODEV)
    names = req["inputs"]
    if names:
        for name, tree in zip(names, input_fds, strict=True):
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"bad input name {name!r}")
            path = f"/inputs/{name}"
            if req["input_dirs"].get(name):
                os.mkdir(path, 0o755)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))
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
            attr = struct.pack(
                "=QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0
            )
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
            os.symlink(path, f"/sandbox/{name}")
    _read_only("/inputs", MS_NOSUID | MS_NODEV)


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
    except Exception as exc:
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"request: {exc}")
    watched = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    # Not dumpable before the fork, so that the program (same uid) can never open pid 1's
    # /proc/1/mem or its descriptors; the program's own copy is made dumpable again.
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    program = os.fork()
    if program == 0:
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        # The descriptor is closed with every other one below; the object must not close its
        # number again later, when it may be the program's.
        sock.detach()
        _restrict(req, status, seccomp_program, boot)
        request: dict[str, Any] = req
        return request
    try:
        # pid 1 needs no privilege from here on: it holds what the program holds, no more.
        _drop_capabilities()
        _install_seccomp(seccomp_program)
    except Exception as exc:
        os.kill(program, signal.SIGKILL)
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"supervisor: {exc}")
    _supervise(sock, program, status, watched)


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
        program = os.fork()
    except Exception as exc:
        _fail(f"arm: {exc}")
    if program == 0:
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        # Closed with every other inherited descriptor in _prepared_program.
        sock.detach()
        g_end.detach()
        return _prepared_program(p_end, arm, seccomp_program, boot)
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
        _limit(program, req["rlimits"])
        # Nothing privileged is left to do: pid 1 drops what the program holds before the
        # program gets its first byte of the request.
        _drop_capabilities()
        _install_seccomp(seccomp_program)
        doc = {"env": req["env"], "script": req["script"], "display": req.get("display")}
        _send(g_end, json.dumps(doc).encode(), [0, 1, 2, status])
        g_end.close()
    except Exception as exc:
        os.kill(program, signal.SIGKILL)
        _report(status, _FAILED << 8, 0.0, 0)
        _fail(f"request: {exc}")
    _supervise(sock, program, status, watched)


def _limit(program: int, rlimits: list[Any]) -> None:
    """The run's rlimits on the waiting program (pid 1 may: same uid, same user namespace)."""
    import resource

    for name, soft, hard, relative in rlimits:
        # The address space the template already maps is not the program's to count.
        base = 0
        if relative:
            with open(f"/proc/{program}/statm") as f:
                base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.prlimit(program, getattr(resource, name), (soft + base, hard + base))


def _prepared_program(
    sock: socket.socket, arm: dict[str, Any], seccomp_program: bytes, boot: dict[str, Any]
) -> dict[str, Any]:
    """P of a pooled sandbox: every restriction that does not depend on the request (all of
    them but the environment and the rlimits, which pid 1 sets), then the request."""
    try:
        _close_all_but({sock.fileno()})
        os.chdir("/sandbox")
        os.umask(0o022)
        _write("/proc/self/oom_score_adj", "1000")
        _drop_capabilities()
    except Exception as exc:
        _fail(f"restrict: {exc}")
    _lock_down(arm.get("landlock"), seccomp_program, boot)
    _reseed()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sock.sendall(b"K")
        body, fds = _recv(sock, 4)
    except Exception:
        os._exit(_FAILED)
    if not body or len(fds) != 4:
        os._exit(0)  # pid 1 let it go
    stdin, stdout, stderr, status = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sock.close()
    req: dict[str, Any] = json.loads(body)
    os.environ.clear()
    os.environ.update(req["env"])
    try:
        os.write(status, b"1")
        os.close(status)
    except OSError as exc:
        _fail(f"status descriptor: {exc}")
    return req


def _lock_down(landlock: Any, seccomp_program: bytes, boot: dict[str, Any]) -> None:
    """The program process's last two walls, in this order on every path: Landlock (needs the
    syscalls seccomp would refuse), then the cold path's full seccomp filter."""
    if landlock is not None:
        boot["_restrict"](landlock)
    try:
        _install_seccomp(seccomp_program)
    except Exception as exc:
        _fail(f"seccomp: {exc}")


def _reseed() -> None:
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _report(status_fd: int, status: int, cpu_ms: float, maxrss: int) -> None:
    try:
        os.write(status_fd, f"W{status} {cpu_ms:.3f} {maxrss}\n".encode())
        os.close(status_fd)
    except OSError:
        pass


def _supervise(
    sock: socket.socket, program: int, status_fd: int, watched: set[signal.Signals]
) -> NoReturn:
    """Wait for the program, end every other process of the run, report, hold the workspace."""
    import resource

    _null_stdio()
    _close_all_but({sock.fileno(), status_fd})
    status: int | None = None
    while status is None:
        info = signal.sigwaitinfo(watched)
        # The host's stop. Any SIGTERM ends the run: the sender is not to be trusted (it can be
        # forged), a program flooding SIGTERM would merge the host's into its own, and a program
        # may end its own run anyway.
        if info.si_signo == signal.SIGTERM:
            os.kill(-1, signal.SIGKILL)
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == program:
                status = st
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


# -- P: the program's process ----------------------------------------------------------------


def _drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two struct __user_cap_data_struct, all zero
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _install_seccomp(program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0),
        "seccomp",
    )


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _restrict(
    req: dict[str, Any], status_fd: int, seccomp_program: bytes, boot: dict[str, Any]
) -> None:
    import resource

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        os.chdir("/sandbox")
        os.umask(0o022)
        os.environ.clear()
        os.environ.update(req["env"])
        _write("/proc/self/oom_score_adj", "1000")
        for name, soft, hard, relative in req["rlimits"]:
            # The address space the template already maps is not the program's to count.
            base = _address_space() if relative else 0
            resource.setrlimit(getattr(resource, name), (soft + base, hard + base))
        _drop_capabilities()
    except Exception as exc:
        _fail(f"restrict: {exc}")
    _lock_down(req.get("landlock"), seccomp_program, boot)
    boot["_close_inherited"](status_fd)
    _reseed()
    try:
        os.write(status_fd, b"1")
        os.close(status_fd)
    except OSError as exc:
        _fail(f"status descriptor: {exc}")


def _exit_status(code: object) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:  # noqa: SIM105 - contextlib is not worth importing in every run
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: S110 - a broken stderr: the status still says it
        pass
    return 1


def _run_program(req: dict[str, Any], boot: dict[str, Any]) -> NoReturn:
    """Run the program as ``__main__``, then exit as the interpreter would, minus its teardown.

    A full interpreter shutdown would also tear down every preloaded module, touching (and so
    copying) the whole template image for nothing: after the program, non-daemon threads are
    joined, atexit handlers run, the program's own globals are released and its garbage
    collected (so open files are flushed and closed), stdio is flushed, and the process exits.
    """
    script = f"/sandcell/{req['script']}"
    sys.argv = [script]
    status = 0
    interrupted = False
    display = req.get("display")
    try:
        boot["_run_python"](script, [], (boot["_display"], display) if display else None)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except KeyboardInterrupt as exc:
        boot["_report"](exc, exc.__traceback__)
        interrupted = True
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
        main = sys.modules.get("__main__")
        if main is not None:
            main.__dict__.clear()
        import gc

        gc.collect()
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # what the interpreter would print at exit
        boot["_report"](exc, exc.__traceback__)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120  # the interpreter's status when stdout cannot be flushed at exit
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _main() -> NoReturn:
    if len(sys.argv) != 3:
        _fail("usage: zygote.pyc CONTROL_FD PRELOAD")
    preload = [m for m in sys.argv[2].split(",") if m]
    sock, seccomp_program, boot = _template(int(sys.argv[1]), preload)
    _run_program(_child(sock, seccomp_program, boot), boot)


if __name__ == "__main__":
    _main()
