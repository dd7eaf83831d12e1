"""One run's program: handed to the runner with its pipes, its output and stdin relayed, its
exit status awaited (:func:`run_program`)."""

from __future__ import annotations

import json
import os
import select
import socket
import time

from .batch import Batch, select_timeout
from .cgroup import kill_cgroup
from .system import reap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .forward import Forwarder
    from .job import Job
    from .port import Port


def run_program(  # noqa: PLR0917 - the agent keeps to plain functions (see the package)
    port: Port,
    runner_pid: int,
    runner_sock: socket.socket,
    job: Job,
    stdin: bytes,
    fwd: Forwarder | None = None,
) -> int:
    """The runner's wait status, once it exited and the program's pipes closed. Meanwhile the
    output goes out in batches, ``stdin`` goes in, a ``K`` frame kills the program's cgroup and
    ``R`` frames reach ``fwd``."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    brief = {k: v for k, v in job.items() if k != "code"}
    socket.send_fds(runner_sock, [json.dumps(brief).encode()], [in_r, out_w, err_w])
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    # Per stream, one byte over the cap tells the host the cap was passed.
    batches = {
        out_r: Batch(port, b"O", job["limits"]["stdout_bytes"] + 1),
        err_r: Batch(port, b"E", job["limits"]["stderr_bytes"] + 1),
    }
    open_fds = [out_r, err_r]
    os.set_blocking(in_w, False)
    pending_in = memoryview(stdin)
    if not pending_in:
        os.close(in_w)
        in_w = -1
    status: int | None = None
    # Woken when the runner exits, not by polling.
    exited = os.pidfd_open(runner_pid)
    while open_fds or status is None:
        wfds = [in_w] if in_w >= 0 else []
        rfds = [*open_fds, port.fd, *([exited] if status is None else [])]
        if fwd is not None and status is None:
            rfds += fwd.rfds()
            wfds += fwd.wfds()
        r, w, _ = select.select(rfds, wfds, [], select_timeout([*batches.values()], 1.0))
        if fwd is not None and status is None:
            fwd.ready(r, w)
        if in_w in w:
            try:
                n = os.write(in_w, pending_in[: 1 << 16])
                pending_in = pending_in[n:]
            except (BlockingIOError, BrokenPipeError):
                n = 0
            if not pending_in or (n == 0 and status is not None):
                os.close(in_w)
                in_w = -1
        for fd in r:
            if fd == exited:
                continue
            if fd == port.fd:
                for kind, payload in port.frames(0):
                    if kind == b"K":
                        kill_cgroup()
                    elif kind == b"R" and fwd is not None:
                        fwd.on_host(payload)
                continue
            if fd not in batches:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.remove(fd)
                os.close(fd)
                batches[fd].flush()
                continue
            batches[fd].add(data)
        now = time.monotonic()
        for batch in batches.values():
            batch.flush_due(now)
        # pid 1 reaps every orphan; the runner's own status is the program's.
        for pid, st in reap():
            if pid == runner_pid and status is None:
                status = st
                # Whatever the program left running dies with it; its pipes then close.
                kill_cgroup()
    for batch in batches.values():
        batch.flush()
    if in_w >= 0:
        os.close(in_w)
    os.close(exited)
    return status
