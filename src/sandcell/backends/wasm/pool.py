"""The wasm rung's warm pool: sandboxes with Pyodide loaded and locked down, each used once.

A pooled sandbox is a session's sandbox (``session.py``) whose kernel runs each "cell" as a
program (``programs=True``): started ahead, it waits with the interpreter restored, the lockdown
applied and the workspace empty. A run takes one, sends the program, reads its output under the
run's limits as a cell's (the wall time interrupts it), exports from the workspace (the program
has ended: the Wasm world has no processes or threads to leave behind), and the sandbox is
destroyed on a background thread while a filler starts its replacement.

A sandbox is made for one shape of run: its limits (the cgroup, the workspace's size, the Wasm
heap), environment, packages and isolation mode are fixed when it starts. The pool keeps the
shape of the last run it served; a run of another shape, with inputs or stdin, starts cold and
the record says why (the next sandboxes take its shape; without ``WarmConfig.refill``, the pool
is filled once and keeps its shape).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.backends.cell import CellRun
from sandcell.backends.cell.verdict import CellCancel
from sandcell.backends.warm import SandboxPoolStats, WarmConfig, idle_memory
from sandcell.spec import Outcome, RunRequest, StartInfo

if TYPE_CHECKING:
    from sandcell.backends.wasm import WasmBackend
    from sandcell.backends.wasm.session import WasmSessionSandbox


@dataclass(frozen=True, slots=True)
class Shape:
    """What a pooled sandbox is made for (see module)."""

    limits: tuple[object, ...]
    env: tuple[tuple[str, str], ...]
    packages: tuple[str, ...]
    mode: str
    landlock: bool | None
    runtime: str | None
    display: bool

    @classmethod
    def of(cls, request: RunRequest) -> Shape:
        lim = request.effective_limits
        return cls(
            limits=(
                lim.memory_bytes,
                lim.max_pids,
                lim.workspace_bytes,
                lim.tmp_bytes,
                lim.stdout_bytes,
                lim.stderr_bytes,
                lim.cpu_time_s,
                lim.max_open_files,
                lim.max_file_bytes,
            ),
            env=tuple(sorted(request.env.items())),
            packages=tuple(str(p) for p in request.packages),
            mode=request.mode.value,
            landlock=request.landlock,
            runtime=request.runtime,
            display=request.display,
        )


def unservable(request: RunRequest) -> str | None:
    """Why ``request`` cannot take a pooled sandbox, or None."""
    if request.inputs:
        return "inputs are mounted when a sandbox starts"
    if request.stdin:
        return "a pooled kernel has no standard input"
    return None


class WasmPool:
    """Keeps ``warm.pool_size`` sandboxes ready (see module)."""

    def __init__(self, backend: WasmBackend, warm: WarmConfig) -> None:
        self.backend = backend
        self.warm = warm
        self._cond = threading.Condition()
        self._ready: deque[tuple[Shape, WasmSessionSandbox]] = deque()
        self._shape_request: RunRequest | None = None
        self._closed = False
        self._starting = 0
        self.started = self.taken = self.discarded = self.refill_errors = 0
        self.last_error: str | None = None
        self._teardowns: list[threading.Thread] = []
        """Sandboxes being destroyed off the result path; :meth:`close` waits for them."""
        self._filler = threading.Thread(target=self._fill, name="sandcell-wasm-pool", daemon=True)
        self._filler.start()

    # -- the filler ----------------------------------------------------------------------------

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) + self._starting >= self.warm.pool_size:
                    self._cond.wait()
                # Without refill (a process that runs one program), the first fill is the last.
                if self._closed or (not self.warm.refill and self.started >= self.warm.pool_size):
                    return
                request = self._shape_request or RunRequest(code="")
                self._starting += 1
            sandbox = None
            try:
                sandbox = self._start(request)
            except Exception as exc:  # a failed start is reported, then retried after a pause
                with self._cond:
                    self.refill_errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
            with self._cond:
                self._starting -= 1
                if sandbox is not None:
                    if self._closed or Shape.of(request) != self._shape():
                        self._destroy(sandbox)
                        self.discarded += 1
                    else:
                        self._ready.append((Shape.of(request), sandbox))
                        self.started += 1
                self._cond.notify_all()
            if sandbox is None:
                time.sleep(1.0)

    def _destroy(self, sandbox: WasmSessionSandbox) -> None:
        thread = threading.Thread(target=sandbox.teardown, name="sandcell-wasm-teardown")
        thread.start()
        with self._cond:
            self._teardowns = [t for t in self._teardowns if t.is_alive()]
            self._teardowns.append(thread)

    def _start(self, request: RunRequest) -> WasmSessionSandbox:
        from sandcell.backends.wasm.session import WasmSessionSandbox

        sandbox = WasmSessionSandbox(
            self.backend, request, session_id=f"wasmpool-{uuid.uuid4().hex[:12]}", programs=True
        )
        sandbox.start()
        return sandbox

    def _shape(self) -> Shape:
        return Shape.of(self._shape_request or RunRequest(code=""))

    # -- a run ---------------------------------------------------------------------------------

    def _take(self, shape: Shape, request: RunRequest) -> tuple[WasmSessionSandbox | None, float]:
        t0 = time.monotonic()
        deadline = t0 + self.warm.take_timeout_s
        with self._cond:
            if shape != self._shape() and not self.warm.refill:
                return None, 0.0
            if shape != self._shape():
                # The pool follows the runs: drop what waits for another shape, fill for this one.
                self._shape_request = replace(request, code="", stdin=b"", exports=())
                stale = list(self._ready)
                self._ready.clear()
                self.discarded += len(stale)
                self._cond.notify_all()
                for _, sb in stale:
                    self._destroy(sb)
                return None, 0.0
            while not self._closed:
                while self._ready:
                    got_shape, sb = self._ready.popleft()
                    self._cond.notify_all()
                    if got_shape == shape and sb.alive():
                        self.taken += 1
                        return sb, (time.monotonic() - t0) * 1000
                    self.discarded += 1
                    self._destroy(sb)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._starting == 0 and self.last_error is not None):
                    return None, 0.0
                self._cond.wait(remaining)
        return None, 0.0

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        on_output: OutputSink | None = None,
    ) -> BackendResult | str:
        """The run on a pooled sandbox, or why it starts cold instead."""
        why = unservable(request)
        if why is not None:
            return why
        sandbox, wait_ms = self._take(Shape.of(request), request)
        if sandbox is None:
            return "no pooled sandbox of this run's shape was ready (the pool now fills for it)"
        cancel = CellCancel()
        limits = request.effective_limits
        try:
            with self.backend.runs.register(run_id, lambda: cancel.request("cancelled")) as c:
                cell = sandbox.run_cell(
                    request.code,
                    timeout_s=limits.wall_time_s,
                    hard_deadline=None,
                    cancel=cancel,
                    on_output=on_output,
                )
            if cell.session_ended is None:
                artifacts, rejected = sandbox.export(request.exports, collect)
            else:
                artifacts, rejected = (), ()
            enforcement = sandbox.enforcement()
        finally:
            self._destroy(sandbox)
        outcome, reason = _run_verdict(
            cell, request, heap=self.backend.heap_limit(request), cancelled=c.reason
        )
        layers = {k: v for k, v in enforcement.layers.items() if k != "session"}
        return BackendResult(
            outcome=outcome,
            exit_code=cell.exit_code if outcome in (Outcome.OK, Outcome.ERROR) else None,
            signal=cell.signal,
            stdout=cell.stdout,
            stderr=cell.stderr,
            stdout_truncated=cell.stdout_truncated,
            stderr_truncated=cell.stderr_truncated,
            usage=cell.usage,
            artifacts=artifacts,
            rejected_exports=rejected,
            enforcement=replace(enforcement, layers=layers),
            reason=reason,
            start=StartInfo(
                mode="pool",
                template=f"pyodide-{self.backend.dist.version}",
                wait_ms=round(wait_ms, 3),
            ),
        )

    # -- report and end ------------------------------------------------------------------------

    @property
    def template_id(self) -> str:
        return f"pyodide-{self.backend.dist.version}"

    def stats(self) -> SandboxPoolStats:
        with self._cond:
            ready = [sb for _, sb in self._ready]
            pids = tuple(
                pid for sb in ready for pid in (sb.sandbox_pid, sb.kernel_pid) if pid is not None
            )
            pss, _ = idle_memory(pids)
            return SandboxPoolStats(
                mode="pool",
                template_id=f"pyodide-{self.backend.dist.version}",
                preload=(),
                size=self.warm.pool_size,
                ready=len(ready),
                started=self.started,
                taken=self.taken,
                discarded=self.discarded,
                refill_errors=self.refill_errors,
                last_error=self.last_error,
                idle_memory_bytes=pss,
            )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            stale = [sb for _, sb in self._ready]
            self._ready.clear()
            self._cond.notify_all()
        for sb in stale:
            sb.teardown()
        self._filler.join(timeout=60)
        with self._cond:
            pending = list(self._teardowns)
        for thread in pending:
            thread.join(timeout=60)


def _run_verdict(
    cell: CellRun, request: RunRequest, *, heap: int | None, cancelled: str | None
) -> tuple[Outcome, str]:
    """A cell's verdict in a run's words: the sandbox is thrown away, so nothing "is kept" and
    no "session" ends; the outcome is the classifier's (``backends/host/outcome.py``)."""
    outcome, reason, exit_code = cell.outcome, cell.reason, cell.exit_code
    limits = request.effective_limits
    if outcome is Outcome.TIMEOUT:
        if "CPU-time" in reason:
            return outcome, f"CPU-time limit of {limits.cpu_time_s} s reached"
        return outcome, f"wall-time limit of {limits.wall_time_s:g} s reached"
    if outcome is Outcome.KILLED and cancelled is not None:
        return outcome, f"cancelled: {cancelled}"
    if outcome is Outcome.KILLED and cell.signal is not None:
        return outcome, f"killed by signal {cell.signal} ({signal.Signals(cell.signal).name})"
    if outcome is Outcome.MEMORY_LIMIT:
        if "Wasm heap" in reason:
            return outcome, f"Wasm heap maximum of {heap} bytes reached"
        return outcome, f"memory limit of {limits.memory_bytes} bytes reached"
    if outcome is Outcome.OUTPUT_LIMIT:
        return outcome, reason.split(";", maxsplit=1)[0]
    if outcome in (Outcome.OK, Outcome.ERROR) and exit_code is not None:
        return outcome, f"exited with status {exit_code}"
    return outcome, reason.removesuffix("; the session ended")
