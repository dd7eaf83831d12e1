"""The wasm rung's warm pool: sandboxes with Pyodide loaded and locked down, each used once.

A pooled sandbox is a session's sandbox (``session.py``) whose kernel runs each "cell" as a
program (``programs=True``): started ahead, it waits with the interpreter restored, the lockdown
applied and the workspace empty. A run takes one, sends the program, reads its output under the
run's limits as a cell's (the wall time interrupts it), exports from the workspace (the program
has ended: the Wasm world has no processes or threads to leave behind), and the sandbox is
destroyed on a background thread while a filler starts its replacement.

The filling, shapes and teardowns are the shared :mod:`sandcell.backends.sandbox_pool`'s (the
Wasm heap is part of a sandbox's shape through its limits). A run of another shape, with inputs
or stdin, starts cold and the record says why (the next sandboxes take its shape; without
``WarmConfig.refill``, the pool is filled once and keeps its shape).
"""

from __future__ import annotations

import signal
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.backends.cell import CellRun
from sandcell.backends.cell.verdict import CellCancel
from sandcell.backends.sandbox_pool import SandboxPool, Shape
from sandcell.backends.warm import SandboxPoolStats, WarmConfig
from sandcell.spec import Outcome, RunRequest, StartInfo

if TYPE_CHECKING:
    from sandcell.backends.wasm import WasmBackend
    from sandcell.backends.wasm.session import WasmSessionSandbox

__all__ = ["Shape", "WasmPool", "unservable"]


def unservable(request: RunRequest) -> str | None:
    """Why ``request`` cannot take a pooled sandbox, or None."""
    if request.inputs:
        return "inputs are mounted when a sandbox starts"
    if request.stdin:
        return "a pooled kernel has no standard input"
    return None


class WasmPool:
    """Keeps ``warm.pool_size`` sandboxes ready (see module; the pool itself is
    :class:`~sandcell.backends.sandbox_pool.SandboxPool`)."""

    def __init__(self, backend: WasmBackend, warm: WarmConfig) -> None:
        self.backend = backend
        self.warm = warm
        self.pool: SandboxPool[WasmSessionSandbox] = SandboxPool(
            warm, start=self._start, name="wasm-pool", template_id=self.template_id
        )

    def _start(self, request: RunRequest) -> WasmSessionSandbox:
        from sandcell.backends.wasm.session import WasmSessionSandbox

        sandbox = WasmSessionSandbox(
            self.backend, request, session_id=f"wasmpool-{uuid.uuid4().hex[:12]}", programs=True
        )
        sandbox.start()
        return sandbox

    # -- a run ---------------------------------------------------------------------------------

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
        sandbox, wait_ms, why = self.pool.take(request)
        if sandbox is None:
            return f"{why} (the pool now fills for this run's shape)"
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
            self.pool.destroy(sandbox)
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
            start=StartInfo(mode="pool", template=self.template_id, wait_ms=round(wait_ms, 3)),
        )

    # -- report and end ------------------------------------------------------------------------

    @property
    def template_id(self) -> str:
        return f"pyodide-{self.backend.dist.version}"

    def stats(self) -> SandboxPoolStats:
        return self.pool.stats()

    def close(self) -> None:
        self.pool.close()


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
