"""sandcell gVisor agent: the container's first process, which waits for its one request.

Usage (inside the sandbox, never by hand)::

    python -I /sandcell/agent.pyc PRELOAD [--channel]

``PRELOAD`` is a comma-separated list of modules to import first (trusted runtime code, never the
program's; empty for a cold run). ``--channel``: stdin is a session's control channel (a socket),
not the program's input: after the request line it is left to the program as fd 0, unread, and
this process closes its own copy, so end-of-file on the channel means the program is gone. Then,
in order:

1. write the ready marker on stderr (a pooled sandbox waits here until a run takes it);
2. read the request from stdin: one JSON line (``env``, ``rlimits``, ``argv``, and ``bridge``
   for a run that reaches outside, ``ingress`` for a session with ports), then the program's
   standard input up to end-of-file, which is moved into a memfd that becomes fd 0;
3. with ``bridge``, start the egress bridge (the loopback proxy port, forwarding to the run's
   proxy socket) under the program's rlimits and seccomp filter, with none of the agent's
   descriptors but its stderr, and wait for the port it prints once it listens; with
   ``ingress``, start the session's ingress agent the same way (it connects to the session's
   ``ingress.sock`` before the program exists, and carries the host's connections to the
   program's servers on loopback);
4. fork. The child replaces its environment with the request's, lowers every rlimit to the
   request's value (soft and hard), sets no_new_privs and installs the seccomp filter the host
   wrote (``seccomp.bpf``: the namespaces backend's compiled policy), writes the started marker
   on stderr (everything after it is the program's) and hands over to the boot (``boot.pyc``,
   loaded as a module, with ``argv`` as its command line), which runs the program;
5. the parent, pid 1 of the sandbox, not dumpable and outside the filter, waits for the child,
   kills every process left (``kill(-1)``: the bridge too), reaps them, and only then writes
   the child's raw wait status as the exit trailer on stderr: nothing of the program is alive
   to forge it, and the host tells an exit status of 137 from a death by SIGKILL (runsc
   reports both as 137).

A malformed request exits 125 with a ``sandcell-agent:`` line on stderr, before the started marker.

Standalone on purpose (stdlib only, and little of it: every import is slow under gVisor's ptrace
platform); the JSON line is parsed with the boot's own scanner.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

READY = b"\x00sandcell-gvisor-ready\n"
STARTED = b"\x00sandcell-gvisor-started\n"
EXIT = b"\x00sandcell-gvisor-exit "
"""The exit trailer: ``EXIT``, the program's raw wait status in decimal, a newline."""
BRIDGE_NAME = b"sandcell-bridge"
"""The egress bridge's process name (``/proc/PID/comm``) inside the sandbox."""
INGRESS_NAME = b"sandcell-ingress"
"""The ingress agent's."""
_FAILED = 125
_BOOT = "/sandcell/boot.pyc"
_SECCOMP = "/sandcell/seccomp.bpf"
_PR_SET_DUMPABLE = 4
_PR_SET_NAME = 15
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_PR_SET_NO_NEW_PRIVS = 38
_SIGKILL = 9


def _fail(message: str) -> NoReturn:
    os.write(2, f"sandcell-agent: {message}\n".encode("utf-8", "backslashreplace"))
    os._exit(_FAILED)


def _load_boot() -> Any:
    loader = sys.modules["_frozen_importlib_external"].SourcelessFileLoader("_sandcell_boot", _BOOT)
    module = type(sys)("_sandcell_boot")
    exec(loader.get_code("_sandcell_boot"), module.__dict__)  # noqa: S102 - sandcell's own boot
    return module


def _read_request(channel: bool) -> tuple[bytes, int | None]:
    """(the JSON line, a memfd holding the rest of stdin, rewound; None for a channel)."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            _fail("stdin closed before a request arrived")
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if channel:
        # The host sends nothing more until the program greets it on the channel.
        if rest:
            _fail("the channel carried data after the request line")
        return line, None
    fd = os.memfd_create("stdin", 0)
    while True:
        view = memoryview(rest)
        while view:
            view = view[os.write(fd, view) :]
        rest = os.read(0, 1 << 20)
        if not rest:
            break
    os.lseek(fd, 0, os.SEEK_SET)
    return line, fd


def _install_seccomp(ctypes: Any, libc: Any) -> None:
    """no_new_privs, then the compiled filter (``struct sock_filter`` array) from the host."""
    try:
        with open(_SECCOMP, "rb") as f:
            program = f.read()
    except OSError as exc:
        _fail(f"seccomp filter: {exc}")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")

    class SockFprog(ctypes.Structure):  # type: ignore[misc]
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))

    prog = SockFprog(len(program) // 8, program)
    # prctl rather than seccomp(2): the same on every architecture.
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        _fail(f"seccomp: {os.strerror(ctypes.get_errno())}")


def _start_bridge(
    argv: list[str],
    rlimits: Any,
    stdin_fd: int | None,
    deps: Any,
    name: bytes = BRIDGE_NAME,
) -> None:
    """Start the egress bridge (``argv``: ``PYTHON -I SCRIPT ARGS...``) and wait until it
    listens (see the module); it is ended with every other process once the program is gone.
    The script runs in a forked child of this interpreter, as ``python -I`` would run it: a
    fresh interpreter costs some 0.2 s under the ptrace platform."""
    what = "egress bridge" if name == BRIDGE_NAME else "ingress agent"
    if len(argv) < 3 or argv[1] != "-I":
        _fail(f"malformed {what} command {argv!r}")
    ctypes, libc, resource = deps
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # stdin is the program's (or a session's channel): the bridge holds none of it.
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(w, 1)
        for fd in (null, w, r, stdin_fd):
            if fd is not None and fd > 2:
                os.close(fd)
        # Its own name (``comm``): its command line is the agent's, being a fork of it.
        libc.prctl(_PR_SET_NAME, name, 0, 0, 0)
        _limit(resource, rlimits)
        _install_seccomp(ctypes, libc)
        os._exit(_run_script(argv[2], argv[3:], what))
    os.close(w)
    said = b""
    while b"\n" not in said:
        chunk = os.read(r, 64)
        if not chunk:
            break
        said += chunk
    os.close(r)
    if not said.strip().isdigit():
        _fail(f"the {what} did not start (it said {said[:200]!r})")


def _run_script(path: str, args: list[str], what: str) -> int:
    """Run the standalone script ``path`` as ``__main__`` with ``args``; its exit status."""
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        sys.argv = [path, *args]
        scope = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
        exec(code, scope)  # noqa: S102 - sandcell's own bridge, read-only in the sandbox
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        os.write(2, f"sandcell-agent: {what}: {exc!r}\n".encode("utf-8", "backslashreplace"))
        return _FAILED
    return 0


def _limit(resource: Any, rlimits: Any) -> None:
    try:
        for name, value in rlimits:
            resource.setrlimit(getattr(resource, name), (value, value))
    except (AttributeError, ValueError, OSError) as exc:
        _fail(f"rlimit: {exc}")


def _supervise(child: int) -> NoReturn:
    """pid 1's duty: wait for the program, end everything else, then report (see the module)."""
    status = 0
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if pid == child:
            status = st
            break
    for _ in range(3):
        try:  # noqa: SIM105 - contextlib is an import this process does not need
            os.kill(-1, _SIGKILL)
        except OSError:
            pass
        while True:
            try:
                os.waitpid(-1, 0)
            except InterruptedError:
                continue
            except ChildProcessError:
                break
    os.write(2, EXIT + str(status).encode() + b"\n")
    os._exit(0)


def main(argv: list[str]) -> None:
    for name in filter(None, argv[1].split(",") if len(argv) > 1 else ()):
        try:
            __import__(name)
        except Exception as exc:  # a missing preload makes the sandbox slower, not unusable
            os.write(2, f"sandcell-agent: preload {name}: {exc}\n".encode())
    boot = _load_boot()
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    channel = len(argv) > 2 and argv[2] == "--channel"
    os.write(2, READY)
    line, stdin_fd = _read_request(channel)
    try:
        request = boot._parse_json(line.decode("utf-8"))
        env, rlimits, boot_argv = request["env"], request["rlimits"], request["argv"]
        bridge, ingress = request.get("bridge"), request.get("ingress")
        if not (
            isinstance(env, dict)
            and all(type(k) is str and type(v) is str for k, v in env.items())
            and all(type(a) is str for a in boot_argv)
            and all(h is None or (h and all(type(a) is str for a in h)) for h in (bridge, ingress))
        ):
            raise ValueError("env, argv, bridge and ingress must be strings")
    except Exception as exc:
        _fail(f"malformed request: {exc}")
    if bridge is not None:
        _start_bridge(bridge, rlimits, stdin_fd, (ctypes, libc, resource))
    if ingress is not None:
        _start_bridge(ingress, rlimits, stdin_fd, (ctypes, libc, resource), INGRESS_NAME)
    if stdin_fd is not None:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
    child = os.fork()
    if child:
        if stdin_fd is None:
            os.close(0)
        # Not dumpable: the program (same uid) can neither ptrace this process nor read its
        # memory, so it cannot write the exit trailer in its place.
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        _supervise(child)
    os.environ.clear()
    os.environ.update(env)
    _limit(resource, rlimits)
    _install_seccomp(ctypes, libc)
    os.write(2, STARTED)
    # The boot sees the command line it would have had as the container's process.
    sys.argv = list(boot_argv)
    orig = getattr(sys, "orig_argv", None)
    if orig is not None:
        sys.orig_argv = [orig[0], "-I", *boot_argv]
    boot._main(sys.argv)


if __name__ == "__main__":
    main(sys.argv)
