"""The namespaces rung's warm pool for JavaScript and TypeScript: sandboxes with Node waiting.

A cold Node run pays for a new sandbox and for Node's start (together about five times a pooled
Python run's time). A pooled sandbox has both done ahead: it is built as a session's sandbox
(``session.py``: layers decided and failed closed, size-capped workspace, the run's cgroup,
seccomp, Landlock by the boot) whose command is Node running ``inside/_node_runner.mjs``, with
the runtime's permission flags, blocked in a read of its channel. A run takes one, writes its
program where a cold run's lies (``/sandcell/main.js`` or ``main.ts``), and tells the runner,
which closes the channel, puts ``/dev/null`` on fd 0 and becomes the program through Node's own
entry point: the same module format detection, type stripping, exit statuses and uncaught-error
reports as ``node main.js``. The host reads its output under the run's caps until the boot
reports the exit status, enforces the wall time by killing the sandbox, exports from the
workspace of a sandbox where nothing runs any more, and classifies the end with the cold path's
own classifier (``host/observe.py``). The sandbox is then destroyed; the shared pool
(``backends/sandbox_pool.py``) starts its replacement.

The pool starts nothing until the first JavaScript or TypeScript run asks for it (that run
starts cold, as does one of another shape, and the record says why): Python-only users keep no
Node waiting. What starts cold instead, always: runs with inputs or standard input (both are
given to a sandbox when it starts), runs that reach outside (ways out are bound at the start),
and runs outside the ``strict`` mode (usage and the memory limit are the run's cgroup's).

Sandboxes started after a TypeScript run load Node's type stripper while they wait (a pooled
TypeScript program then starts about 100 ms sooner); a JavaScript run that takes one of them
has it in its memory (about 10 MiB of its cgroup's limit) where a cold run would not.

Security limitations: those of a cold Node run on this rung. A pooled sandbox's CPU-time limit
(RLIMIT_CPU) and cgroup count Node's start, as a cold run's do; the stack of an uncaught error
ends with the runner's timer frame rather than Node's ``run_main_module``; fd 0 is
``/dev/null`` where a cold run's is an empty file.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends import inside
from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.backends.cell import CappedOutput, Exported
from sandcell.backends.cell.channel import ChannelError, encode
from sandcell.backends.host.layout import CONTROL_DIR
from sandcell.backends.host.observe import observed
from sandcell.backends.host.process import Launched, StopPipe, decode_wait
from sandcell.backends.namespaces.prepared import boot_command
from sandcell.backends.namespaces.session import SessionSandbox
from sandcell.backends.sandbox_pool import SandboxPool
from sandcell.backends.warm import SandboxPoolStats, WarmConfig
from sandcell.run_sockets import SandboxSockets
from sandcell.runtimes import code_path
from sandcell.spec import NODE_LANGUAGES, IsolationMode, RunRequest, StartInfo

if TYPE_CHECKING:
    from sandcell.backends.namespaces import NamespacesBackend

__all__ = ["POOLED_MARK", "RUNNER", "NodePool", "PooledNodeSandbox", "unservable"]

RUNNER = "node_runner.mjs"
"""The runner's name in the control directory."""
POOLED_MARK = "pooled"
"""The runner's last argument: a waiting sandbox says so in a process listing (the suite's host
scans leave such sandboxes alone, as the wasm pool's)."""
_RUNNER_SOURCE = Path(inside.__file__).resolve().parent / "_node_runner.mjs"
WARM_TS = "node_warm.ts"
"""A TypeScript module the runner loads (and forgets) so that Node's type stripper is loaded."""
_WARM_TS = b"const warm: number = 1;\n"
_READ_CHUNK = 65536
_STARTED_TIMEOUT_S = 10.0
"""How long a runner has to confirm the program's start (it only reads one message first)."""


def unservable(request: RunRequest, sockets: SandboxSockets | None) -> str | None:
    """Why ``request`` starts cold rather than in a pooled Node sandbox, or None."""
    if request.language not in NODE_LANGUAGES:
        return f"{request.language} programs do not run in the Node pool"
    if request.inputs:
        return "inputs are mounted when a sandbox starts"
    if request.stdin:
        return "a pooled Node sandbox has no standard input (it is given at a sandbox's start)"
    if sockets is not None:
        return "a run that reaches outside starts cold (ways out are bound at a sandbox's start)"
    if request.mode is not IsolationMode.STRICT:
        mode = request.mode.value
        return f"the {mode} mode starts cold (a pooled sandbox's limits are its cgroup's)"
    return None


class PooledNodeSandbox(SessionSandbox):
    """One sandbox with Node waiting to become one program (see module)."""

    def __init__(self, backend: NamespacesBackend, request: RunRequest, *, session_id: str):
        super().__init__(backend, request, session_id=session_id)
        self._program: Path | None = None

    def _prepare(self) -> None:
        self.prepared.create({RUNNER: _RUNNER_SOURCE.read_bytes(), WARM_TS: _WARM_TS})

    def _command(self) -> list[str]:
        runtime = self.prepared.runtime
        return boot_command(
            runtime.sandbox_python,
            "exec",
            runtime.sandbox_interpreter,
            *runtime.interpreter_args,
            f"{CONTROL_DIR}/{RUNNER}",
            # After a TypeScript run, the next sandboxes load Node's type stripper ahead (about
            # 100 ms of a TypeScript program's start; it would only slow a JavaScript one's
            # exit, so it waits for the last run to be TypeScript: sandbox_pool.py).
            *(("typescript",) if self.request.language == "typescript" else ()),
            POOLED_MARK,
        )

    def run_program(
        self,
        request: RunRequest,
        *,
        stop_fd: int,
        on_output: OutputSink | None = None,
    ) -> Launched:
        """Run ``request``'s program here, once; what a cold launch would have observed."""
        limits = request.effective_limits
        path = code_path(request.language)
        # The control directory is the sandbox's /sandcell: the program lies where a cold
        # run's does, read-only to it.
        self._program = self.prepared.control / path.name
        self._program.write_bytes(request.code.encode("utf-8"))
        self._program.chmod(0o444)
        out = CappedOutput(limits.stdout_bytes, stream="stdout", on_output=on_output)
        err = CappedOutput(limits.stderr_bytes, stream="stderr", on_output=on_output)
        assert self._sock is not None
        t0 = time.monotonic()
        # A runner already gone: its end is read below, and the run did not start.
        with contextlib.suppress(OSError):
            self._sock.sendall(encode({"op": "run", "path": str(path)}))
        started, stopped_by, status = self._supervise(
            out, err, stop_fd=stop_fd, deadline=t0 + limits.wall_time_s
        )
        if status is None:
            self._kill()
            status = self._reported_status()
        self._drain(out, err)
        out.flush()
        err.flush()
        wall_ms = (time.monotonic() - t0) * 1000
        code, sig = decode_wait(status) if status is not None else (None, None)
        if not started:
            # The runner failed before the program: its output is why (an infra error).
            err.data[:0] = b"the pooled Node sandbox ended before the program started: "
        return Launched(
            started=started,
            exit_code=code,
            signal=sig,
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            stopped_by=stopped_by,
            wall_ms=wall_ms,
            cpu_ms_rusage=0.0,
            maxrss_bytes_rusage=0,
        )

    def _supervise(
        self, out: CappedOutput, err: CappedOutput, *, stop_fd: int, deadline: float
    ) -> tuple[bool, str | None, int | None]:
        """Read output until the boot reports the program's end, or stop it: (started,
        stopped_by, wait status or None when it was stopped)."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None and self._sock is not None
        out_fd, err_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        sock: socket.socket | None = self._sock
        started = False
        started_by = time.monotonic() + _STARTED_TIMEOUT_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                return started, "wall_time", None
            if not started and now >= started_by:
                return False, None, None
            # The channel first: its "started" was sent before anything of the program's.
            watch = [sock.fileno()] if sock is not None else []
            watch += [out_fd, err_fd, stop_fd]
            if self._status_r is not None:
                watch.append(self._status_r)
            limit = deadline if started else min(deadline, started_by)
            ready, _, _ = select.select(watch, [], [], limit - now)
            for fd in ready:
                if sock is not None and fd == sock.fileno():
                    # Only the runner's "started" is read; the runner closes the channel next.
                    started = self._started(sock)
                    sock = None
                elif fd == stop_fd:
                    return started, "cancelled", None
                elif fd == self._status_r:
                    chunk = os.read(fd, _READ_CHUNK)
                    self._status += chunk
                    status = self._reported_status()
                    if status is not None or not chunk:
                        return started, None, status
                else:
                    chunk = os.read(fd, _READ_CHUNK)
                    if chunk and (out if fd == out_fd else err).add(chunk):
                        return started, "stdout" if fd == out_fd else "stderr", None

    def _started(self, sock: socket.socket) -> bool:
        try:
            self._decoder.feed(sock.recv(_READ_CHUNK))
            return any(m.get("op") == "started" for m in self._decoder.messages())
        except (OSError, ChannelError):  # a malformed frame: not started
            return False

    def teardown(self, globs: Sequence[str] = (), collect: Collector | None = None) -> Exported:
        # The program's file is written here, not by the prepared sandbox: removed first, so
        # that the control directory holds only what the prepared sandbox removes by name.
        if self._program is not None:
            with contextlib.suppress(OSError):
                self._program.unlink()
        return super().teardown(globs, collect)


class NodePool:
    """The namespaces rung's pool of waiting Node sandboxes (see module)."""

    def __init__(self, backend: NamespacesBackend, warm: WarmConfig) -> None:
        self.backend = backend
        self.pool: SandboxPool[PooledNodeSandbox] = SandboxPool(
            warm,
            start=self._start,
            name="node-pool",
            template_id="node",
            first=None,
            runtime="node",  # every JavaScript or TypeScript run's (runtimes/node)
        )

    def _start(self, request: RunRequest) -> PooledNodeSandbox:
        sandbox = PooledNodeSandbox(
            self.backend, request, session_id=f"nodepool-{uuid.uuid4().hex[:12]}"
        )
        sandbox.start()
        return sandbox

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult | str:
        """The run in a pooled sandbox, or why it starts cold instead (nothing ran then)."""
        why = unservable(request, sockets)
        if why is not None:
            return why
        layers = self.backend.decide(request)  # fails closed as a cold start would
        sandbox, wait_ms, why = self.pool.take(request)
        if sandbox is None:
            return f"{why} (the Node pool now fills for this run's shape)"
        stop = StopPipe()
        try:
            with self.backend.runs.register(run_id, stop.set) as cancellation:
                launched = sandbox.run_program(request, stop_fd=stop.r, on_output=on_output)
            cg = sandbox.cgroup.usage() if sandbox.cgroup is not None else None
            # The program has ended or was killed with its sandbox: the workspace is still.
            artifacts, rejected = (
                sandbox.export(request.exports, collect) if launched.started else ((), ())
            )
        finally:
            stop.close()
            self.pool.destroy(sandbox)
        runtime = sandbox.prepared.runtime
        template = f"node-{(runtime.tree_sha256 or runtime.sha256)[:12]}"
        enforcement = self.backend.enforcement(request, layers)
        ll = dict(enforcement.layers)
        ll["warm_start"] = (
            f"pool {template}: a sandbox started ahead as a cold one is (bubblewrap "
            f"{self.backend.bwrap.version_text}), Node waiting for the program, used once"
        )
        return observed(
            launched,
            cg,
            request,
            cancel_reason=cancellation.reason,
            artifacts=artifacts,
            rejected=rejected,
            enforcement=replace(enforcement, layers=ll),
            start=StartInfo(mode="pool", template=template, wait_ms=round(wait_ms, 3)),
        )

    def stats(self) -> SandboxPoolStats:
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()
