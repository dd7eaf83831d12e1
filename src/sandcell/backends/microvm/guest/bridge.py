"""The run's loopback: the interface brought up, and the host's egress bridge served on it.

The bridge (the host's ``sandcell_bridge.py``, sent in the job's ``sockets`` library) listens on
127.0.0.1 for HTTP clients and forwards to ``egress.sock`` (:mod:`.forward`). A session's ingress
agent (``sandcell_ingress.py``) is started the same way: it connects to ``ingress.sock`` and
carries the host's connections to the program's servers on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import time

from .cgroup import PROG_CG
from .system import GID, UID, write_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .job import Job

SOCKETS_DIR = "/run/sandcell"
GUEST_PYTHON = "/usr/bin/python3"
BRIDGE_TIMEOUT_S = 60.0
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1


def loopback_up() -> None:
    """The guest's loopback interface (its only one): the bridge listens on it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0))
        flags = struct.unpack_from("16sh", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
    finally:
        s.close()


def start_bridge(spec: Job, lim: Job, key: str = "bridge_argv") -> int:
    """Start the bridge (or the helper ``spec[key]`` names: ``ingress_argv``) as the program's
    user in the program's cgroup (its limits, and it dies with the program's processes);
    returns the number it printed once ready (the bridge's port).

    The host's command is ``GUEST_PYTHON -I BRIDGE ARGS``: this interpreter, which runs it in a
    forked child instead of starting anew (seconds under TCG). The child holds none of the
    agent's descriptors, and having changed its credentials without an exec it is not
    dumpable: the program, of the same uid, cannot read its memory."""
    import resource

    argv = spec[key]
    script = argv[2]
    if argv[:2] != [GUEST_PYTHON, "-I"] or not script.startswith(SOCKETS_DIR + "/lib/"):
        raise ValueError(f"unexpected bridge command {argv!r}")
    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), script, "exec", dont_inherit=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 127
        try:
            os.close(r)
            write_file(PROG_CG + "/cgroup.procs", str(os.getpid()))
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(w, 1)
            os.dup2(w, 2)
            # The port, the runner's socket, the listeners: the agent's, not the bridge's.
            os.closerange(3, 1 << 16)
            os.chdir("/")
            os.setgroups([])
            os.setresgid(GID, GID, GID)
            os.setresuid(UID, UID, UID)
            for res, value in (
                (resource.RLIMIT_CPU, int(lim["cpu_time_s"])),
                (resource.RLIMIT_NOFILE, int(lim["max_open_files"])),
                (resource.RLIMIT_NPROC, int(lim["max_pids"])),
                (resource.RLIMIT_FSIZE, 0),
                (resource.RLIMIT_CORE, 0),
            ):
                resource.setrlimit(res, (value, value))
            import sys

            sys.argv = argv[2:]
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            ns = {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__}
            exec(code, ns)  # noqa: S102 - the host's bridge, as its command line would run it
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(status)
    os.close(w)
    out = b""
    deadline = time.monotonic() + BRIDGE_TIMEOUT_S
    try:
        while b"\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                raise RuntimeError("the loopback bridge did not start in time")
            chunk = os.read(r, 4096)
            if not chunk:
                break
            out += chunk[: 1 << 14]
    finally:
        os.close(r)
    line = out.partition(b"\n")[0].strip()
    if not line.isdigit():
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"the loopback bridge failed: {' | '.join(tail)[:400]}")
    return int(line)
