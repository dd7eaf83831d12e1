"""The code a job takes, run once before a VM waits in the pool (the host's ``P`` frame).

A VM restored from a snapshot starts with nothing translated; what is translated here, before
the snapshot or before the VM waits in the pool, is not translated during a run (under TCG,
hundreds of milliseconds).
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import time

from .bridge import SIOCGIFFLAGS
from .cgroup import PROG_CG, cgroup_stats, cpu_usage_ms
from .job import reseed, set_identity, start_workspace
from .system import libc, reap, write_file


def warm_kernel_paths(runner_pid: int) -> None:
    """The code a job takes here (mounts, cgroup files, clock, entropy, the program's pipes),
    run once and undone: a VM restored from a snapshot starts with nothing translated, and
    what is translated here before it waits in the pool is not translated during a run."""
    warm = {"inputs": [], "code": "pass\n", "code_path": "/sandcell/main.py"}
    lim = {"workspace_bytes": 1 << 20, "workspace_inodes": 64, "tmp_bytes": 1 << 20}
    start_workspace(warm, lim)
    for target in (b"/sandcell", b"/dev/shm", b"/tmp", b"/home/user", b"/sandbox"):
        libc.umount2(target, 0)
    reseed(os.urandom(64), credit=False)
    set_identity({"time_ns": time.time_ns(), "hostname": socket.gethostname()})
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        write_file(f"{PROG_CG}/{name}", "max")
    cgroup_stats(cpu_usage_ms())
    fds = [*os.pipe(), os.pidfd_open(runner_pid)]
    select.select(fds, [], [], 0)
    reap()
    for fd in fds:
        os.close(fd)
    # A run with sockets compiles the bridge (see bridge.start_bridge) and brings the loopback
    # up: the compiler's and the network stack's code, translated now, is hundreds of
    # milliseconds less under TCG (the flags are only read here).
    compile(WARM_MODULE, "<warm>", "exec", dont_inherit=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0))


WARM_MODULE = """
from __future__ import annotations
import contextlib, os, socket, sys, threading
_CHUNK = 64 * 1024
class Bridge:
    \"\"\"Doc.\"\"\"
    def __init__(self, listen: tuple[str, int], target: str) -> None:
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._thread: threading.Thread | None = None
        self.port: int = self._listener.getsockname()[1]
    def serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()
def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return
def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0] or not argv[0].rpartition(":")[2].isdigit():
        print("usage", file=sys.stderr)
        return 2
    host, _, port = argv[0].rpartition(":")
    print(f"{port} {[p for p in argv if p]}", flush=True)
    return 0
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""
"""Source shaped like the bridge's (classes, annotations, f-strings, a walrus): compiled once,
it warms the compiler's paths a run's bridge then takes."""
