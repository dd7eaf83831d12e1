"""A session on the wasm rung: one Pyodide kernel kept alive in one namespaces sandbox.

The namespaces rung's :class:`~sandcell.backends.namespaces.session.SessionSandbox` does all of
it (the sandbox, the cell channel, cell limits, interrupts, exports, pause with files); what
differs is what the boot starts: Node running ``_runner.mjs`` in kernel mode, whose interpreter
runs on a worker thread so that the main thread can turn the host's SIGINT into Pyodide's
interrupt (a KeyboardInterrupt in the cell; the session and its variables are kept). The kernel
speaks ``_kernel.py``'s channel. Rich outputs go through the display module (``_display.py``,
shipped as source): a cell's last expression's value and ``display()``; tables and figures need
pandas and matplotlib, which the rung does not have.

A pooled sandbox (``pool.py``) is the same kernel with ``programs=True``: each "cell" runs as a
program in a fresh ``__main__`` and replies with its exit status.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from sandcell.backends.cell.state import RestorePoint
from sandcell.backends.namespaces.prepared import boot_command
from sandcell.backends.namespaces.session import SessionSandbox
from sandcell.backends.wasm import WasmBackend, capabilities, plan
from sandcell.spec import RunRequest


class WasmSessionSandbox(SessionSandbox):
    """A live sandbox whose kernel is Pyodide (see module)."""

    lacking: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "bash": (
                "the wasm rung runs Python only: Bash cells need processes, which WebAssembly does "
                f"not have; open the session on the {capabilities.OTHER_RUNGS} rung (--backend)"
            ),
            "processes": (
                "the wasm rung has no processes (Python runs as WebAssembly): no background "
                f"processes, terminals or watches; use the {capabilities.OTHER_RUNGS} rung"
            ),
        }
    )
    """What this sandbox cannot do (``backends.cell.lacking``), refused before any cell."""

    def __init__(
        self,
        backend: WasmBackend,
        request: RunRequest,
        *,
        session_id: str,
        restore: RestorePoint | None = None,
        programs: bool = False,
    ) -> None:
        self.wasm_backend = backend
        self.outer_request = request
        self.programs = programs
        super().__init__(
            backend, backend.inner_request(request), session_id=session_id, restore=restore
        )

    def _prepare(self) -> None:
        files = self.wasm_backend.control_files(
            self.outer_request, "kernel", programs=self.programs
        )
        self.display = plan.DISPLAY in files
        self.prepared.create(files, freezer=True)

    def _command(self) -> list[str]:
        runtime = self.prepared.runtime
        return boot_command(
            runtime.sandbox_python,
            "exec",
            *self.wasm_backend.node_argv("kernel", pooled=self.programs),
        )


__all__ = ["WasmSessionSandbox"]
