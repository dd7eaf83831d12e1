"""A session: the runner becomes the host's kernel, relayed cell by cell until the VM goes.

The kernel is the one the host sent: Python's runs in the runner's process (:data:`SESSION_BOOT`);
a JavaScript or TypeScript session's, Node's ``_kernel.mjs``, is written where the job says and
the runner executes Node on it with the job's interpreter arguments and the kernel's own.

:func:`session_main` sets the session up as a run is set up, then :class:`KernelRelay` carries
the kernel's messages, output and end between the kernel and the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time

from .batch import Batch, select_timeout
from .cgroup import cgroup_stats, kill_cgroup, prepare_cgroup
from .files import list_workspace, send_session_files
from .forward import Forwarder
from .job import receive_inputs, reseed, set_identity, usage_now
from .system import reap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .job import Job
    from .port import Port

SESSION_DIR = "/run/sandcell"
# The program the runner runs for a session: the host's kernel (``_kernel.py``), in the runner's
# process (the preloaded modules already imported), with the display module the agent compiled.
SESSION_BOOT = (
    "import sys\n"
    "sys.argv = ['/sandcell/kernel.py', '--display', '/run/sandcell/display.pyc']\n"
    "with open('/run/sandcell/kernel.py', encoding='utf-8') as f:\n"
    "    source = f.read()\n"
    "exec(compile(source, '/sandcell/kernel.py', 'exec', dont_inherit=True),\n"
    "     {'__name__': '__main__', '__builtins__': __builtins__})\n"
)


def write_session_files(job: Job) -> None:
    """The host's kernel source, and its display module compiled by this interpreter (the
    runtime's base interpreter: the runner loads the bytecode)."""
    os.makedirs(SESSION_DIR, mode=0o755, exist_ok=True)
    with open(SESSION_DIR + "/kernel.py", "w", encoding="utf-8") as f:
        f.write(job["kernel_source"])
    import marshal
    import sys

    source = job["display_source"]
    code = compile(source, "/sandcell/display.py", "exec", dont_inherit=True)
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    header = magic + bytes(8) + (len(source) & 0xFFFFFFFF).to_bytes(4, "little")
    with open(SESSION_DIR + "/display.pyc", "wb") as f:
        f.write(header + marshal.dumps(code))


def session_main(
    port: Port,
    runner_pid: int,
    runner_sock: socket.socket,
    job: Job,
    frames: list[tuple[bytes, bytes]],
) -> None:
    """Serve one session: the runner becomes the kernel; cells, output, interrupts and files
    are relayed until the host destroys the VM."""
    # At once: the host tells an agent that knows sessions from one that ignores the job.
    port.send(b"q")
    fwd = None
    port.early = frames
    # A Node kernel (JavaScript, TypeScript) is the runner's program, as a Node run's is; the
    # Python kernel runs in the runner's own process.
    node = "kernel_path" in job
    if node:
        job["code"], job["code_path"] = job["kernel_source"], job["kernel_path"]
    else:
        job["code"], job["code_path"] = SESSION_BOOT, "/sandcell/boot.py"
    try:
        reseed(bytes.fromhex(job["entropy"]))
        set_identity(job)
        prepare_cgroup(job["limits"])
        if not node:
            write_session_files(job)
        if job.get("sockets"):
            fwd = Forwarder(port)
            fwd.setup(job["sockets"], job["limits"])
        receive_inputs(port, job)
    except Exception as exc:
        port.send(b"W", json.dumps({"message": f"guest session setup failed: {exc}"}).encode())
        raise
    ctl, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    skip = ("code", "kernel_source", "display_source")
    brief = {k: v for k, v in job.items() if k not in skip}
    if node:
        brief.update(display=False, args=job["kernel_args"])
    else:
        brief.update(language="python", display=False)
    socket.send_fds(runner_sock, [json.dumps(brief).encode()], [kernel_end.fileno(), out_w, err_w])
    kernel_end.close()
    os.close(out_w)
    os.close(err_w)
    runner_sock.close()
    KernelRelay(port, runner_pid, ctl, out_r, err_r, lim=job["limits"], fwd=fwd).serve()


class KernelRelay:
    """Between the host and the session's kernel (see :func:`session_main`)."""

    def __init__(
        self,
        port: Port,
        pid: int,
        ctl: socket.socket,
        out_r: int,
        err_r: int,
        *,
        lim: Job,
        fwd: Forwarder | None = None,
    ) -> None:
        self.port = port
        self.fwd = fwd
        self.pid = pid
        self.ctl: socket.socket | None = ctl
        ctl.setblocking(False)
        self.outs = [out_r, err_r]
        # Non-blocking: a select's answer is stale once a drain (see from_kernel) read the pipe.
        for fd in self.outs:
            os.set_blocking(fd, False)
        # Per cell, as for a run: one byte over the cap tells the host the cap was passed.
        self.per_cell = {out_r: lim["stdout_bytes"] + 1, err_r: lim["stderr_bytes"] + 1}
        self.batches = {
            out_r: Batch(port, b"O", self.per_cell[out_r]),
            err_r: Batch(port, b"E", self.per_cell[err_r]),
        }
        self.to_kernel = bytearray()
        self.status: int | None = None

    def serve(self) -> None:
        exited = os.pidfd_open(self.pid)
        while True:
            rfds = [*self.outs, self.port.fd]
            if self.ctl is not None:
                rfds.append(self.ctl.fileno())
            if self.status is None:
                rfds.append(exited)
            wfds = [self.ctl.fileno()] if self.ctl is not None and self.to_kernel else []
            if self.fwd is not None and self.status is None:
                rfds += self.fwd.rfds()
                wfds += self.fwd.wfds()
            r, w, _ = select.select(rfds, wfds, [], select_timeout([*self.batches.values()], 1.0))
            if self.fwd is not None and self.status is None:
                self.fwd.ready(r, w)
            if self.ctl is not None and self.ctl.fileno() in w:
                self.flush_to_kernel()
            if self.ctl is not None and self.ctl.fileno() in r:
                self.from_kernel()
            for fd in list(self.outs):
                if fd in r:
                    self.relay_output(fd)
            now = time.monotonic()
            for batch in self.batches.values():
                batch.flush_due(now)
            if self.port.fd in r or self.port.early:
                for kind, payload in self.port.frames(0):
                    self.on_host(kind, payload)
            for pid, st in reap():
                if pid == self.pid and self.status is None:
                    self.kernel_ended(st)

    def flush_to_kernel(self) -> None:
        assert self.ctl is not None
        try:
            n = self.ctl.send(self.to_kernel[: 1 << 16])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.to_kernel.clear()
            return
        del self.to_kernel[:n]

    def from_kernel(self) -> None:
        assert self.ctl is not None
        try:
            data = self.ctl.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        # The kernel flushes a cell's output before it replies, so once the reply is read all
        # that output is in the pipes: relay it first. Drained after the read, not before: a
        # quick cell can print and reply between a drain and the read (its "started" message
        # woke this up). The drain is bounded: a process the cell left writing cannot hold the
        # reply back.
        for fd in list(self.outs):
            for _ in range(64):
                if fd not in self.outs or not select.select([fd], [], [], 0)[0]:
                    break
                self.relay_output(fd)
        # The host keeps a cell's output until its reply: what is held goes before it.
        for batch in self.batches.values():
            batch.flush()
        if not data:
            self.ctl.close()
            self.ctl = None
            return
        self.port.send(b"M", data)
        self.port.send(b"a", json.dumps(cgroup_stats(None)).encode())

    def relay_output(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self.outs.remove(fd)
            os.close(fd)
            self.batches[fd].flush()
            return
        self.batches[fd].add(data)

    def on_host(self, kind: bytes, payload: bytes) -> None:
        if kind == b"C":
            for fd, batch in self.batches.items():
                batch.reset(self.per_cell[fd])
            if self.ctl is not None:
                self.to_kernel += payload
                self.flush_to_kernel()
        elif kind == b"I":
            if self.status is None:
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGINT)
        elif kind == b"K":
            kill_cgroup()
        elif kind == b"R" and self.fwd is not None:
            self.fwd.on_host(payload)
        elif kind == b"T":
            list_workspace(self.port)
            self.port.send(b"Z")
        elif kind == b"U":
            send_session_files(self.port, payload)
            self.port.send(b"Z")
        elif kind == b"Y":
            self.resumed(payload)
        elif kind == b"V":
            self.port.send(b"v", json.dumps(usage_now()).encode())

    def resumed(self, payload: bytes) -> None:
        """The VM was restored from a saved state: the kernel's generator would draw what every
        other copy of that state draws, and the wall clock stopped when it was saved."""
        # The reply carries the cgroup's usage: the host's CPU time of the next cell counts
        # from it, as from the usage that follows a kernel message.
        report = cgroup_stats(None)
        try:
            doc = json.loads(payload)
            reseed(bytes.fromhex(doc["entropy"]))
            time.clock_settime_ns(time.CLOCK_REALTIME, int(doc["time_ns"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
        self.port.send(b"y", json.dumps(report).encode())

    def kernel_ended(self, status: int) -> None:
        self.status = status
        # Whatever the cells left running ends with the kernel, as the session does.
        kill_cgroup()
        for batch in self.batches.values():
            batch.flush()
        report = cgroup_stats(None)
        report["status"] = status
        self.port.send(b"X", json.dumps(report).encode())
