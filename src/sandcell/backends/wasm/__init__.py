"""The wasm rung: Python compiled to WebAssembly (Pyodide) inside the namespaces sandbox.

Two walls. The outer one is an ordinary namespaces run, built by the namespaces rung's own code
(this rung is the one that builds on another: :class:`WasmBackend` is a
:class:`~sandcell.backends.namespaces.NamespacesBackend` whose sandbox runs Node.js instead of
CPython): its namespaces, seccomp filter, Landlock, cgroup limits, size-capped workspace, no
network. The inner one is WebAssembly: the program's interpreter has no system calls of its own,
only the files the runner mounts into its virtual filesystem (the workspace, ``/tmp``, inputs and
packages), and no way to JavaScript or Node (``_lockdown.py``, ``_runner.mjs``, Node's permission
model: :mod:`~sandcell.backends.wasm.plan`). Memory has two limits: the Wasm heap's maximum (a
MemoryError, classified ``memory_limit``) below the cgroup's.

What the rung cannot do is refused before the run, never moved to a weaker rung
(:mod:`~sandcell.backends.wasm.capabilities`): bash, the network and governed tools, packages
with compiled code (numpy, pandas...), and a program that imports one. Start modes: cold (a new
sandbox restores Pyodide's memory snapshot, ``dist.py``) and pool (sandboxes with Pyodide
loaded and locked down, waiting: ``pool.py``); sessions keep one Pyodide kernel
(``session.py``).

Security limitations: those of the namespaces rung for Node itself (a V8 bug that escapes the
Wasm sandbox lands in the namespaces sandbox, with Node's allowed system calls). Pyodide's
``_pyodide_core`` is compiled into the interpreter and can be imported again by a program that
removes the lockdown's finder; the JavaScript objects it makes reach only the emptied realm
(no ``process``, ``require``, ``fetch``, no code from strings) and Node's permission model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.backends import inside
from sandcell.backends.base import BackendResult, BackendStatus, Collector, OutputSink
from sandcell.backends.host.layout import CONTROL_DIR
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.namespaces.prepared import SANDBOX_INIT, Layers, boot_command
from sandcell.backends.warm import WarmConfig, WarmReport
from sandcell.backends.wasm import capabilities, dist, plan
from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.run_sockets import SandboxSockets
from sandcell.runtimes import Runtime, code_path
from sandcell.spec import Enforcement, IsolationMode, Language, RunRequest

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint
    from sandcell.backends.wasm.pool import WasmPool

_HERE = os.path.dirname(__file__)
RUNNER_SCRIPT = os.path.join(_HERE, "_runner.mjs")
LOCKDOWN_SCRIPT = os.path.join(_HERE, "_lockdown.py")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class WasmBackend(NamespacesBackend):
    """Runs each Python program in Pyodide, in a fresh namespaces sandbox (see module)."""

    name = "wasm"

    def __init__(self, warm: WarmConfig | None = None) -> None:
        self.dist = dist.find()
        self._runner = _read(RUNNER_SCRIPT)
        self._lockdown = _read(LOCKDOWN_SCRIPT)
        self._display = _read(str(inside.DISPLAY_SCRIPT))
        # The namespaces rung's warm starts fork a CPython template: not this rung's; its pool
        # keeps sandboxes with Pyodide loaded instead.
        super().__init__(warm=None)
        self._pool: WasmPool | None = None
        if warm is not None and warm.mode == "pool":
            from sandcell.backends.wasm.pool import WasmPool

            self._pool = WasmPool(self, warm)

    # -- what the rung runs ------------------------------------------------------------------

    def inner_request(self, request: RunRequest) -> RunRequest:
        """The namespaces sandbox's request: the program's, with Pyodide's files mounted beside
        the packages. Refuses what the rung cannot run (ConfigError, IsolationUnavailable)."""
        capabilities.check(request)
        return replace(request, packages=(*request.packages, self.dist.directory))

    def wasm_plan(
        self, request: RunRequest, mode: plan.Mode, *, programs: bool = False
    ) -> plan.WasmPlan:
        """``request`` is the caller's (before :meth:`inner_request`)."""
        outer = [p for p in request.packages if p != self.dist.directory]
        return plan.plan(
            replace(request, packages=tuple(outer)), self.dist, mode, programs=programs
        )

    def control_files(
        self, request: RunRequest, mode: plan.Mode, *, programs: bool = False
    ) -> dict[str, bytes]:
        """The control directory's files; ``programs``: a kernel whose cells are programs (a
        pooled sandbox)."""
        settings = self.wasm_plan(request, mode, programs=programs).settings
        files = {
            plan.RUNNER: self._runner,
            plan.LOCKDOWN: self._lockdown,
            plan.SETTINGS: json.dumps(settings).encode(),
        }
        if settings["display"] is not None:
            files[plan.DISPLAY] = self._display
        if mode == "run":
            files[code_path("python").name] = request.code.encode("utf-8")
        return files

    def node_argv(self, mode: plan.Mode, *, pooled: bool = False) -> tuple[str, ...]:
        return plan.node_argv(self.dist.node, mode, pooled=pooled)

    def node_command(self, runtime: Runtime, mode: plan.Mode) -> list[str]:
        """The sandbox's command: the boot (Landlock, then exec) starting Node."""
        return boot_command(runtime.sandbox_python, "exec", *self.node_argv(mode))

    # -- NamespacesBackend's hooks -------------------------------------------------------------

    def _command_for(self, language: Language, runtime: Runtime) -> list[str]:
        boot = self.node_command(runtime, "run")
        return boot if self.native_init is None else [SANDBOX_INIT, *boot]

    def _control_files(self, request: RunRequest) -> dict[str, bytes]:
        return self.control_files(request, "run")

    def heap_limit(self, request: RunRequest) -> int | None:
        return plan.heap_max(request)

    def versions(self) -> Mapping[str, str]:
        return {
            **super().versions(),
            "pyodide": self.dist.version,
            "python": f"CPython {self.dist.python} (WebAssembly)",
            "node": self.dist.node_version,
        }

    def enforcement(
        self, request: RunRequest, layers: Layers, sockets: SandboxSockets | None = None
    ) -> Enforcement:
        outer = super().enforcement(request, layers, sockets)
        wasm = {
            "webassembly": (
                f"{self.dist.describe()}: no system calls, processes or sockets; files: the "
                "workspace, /tmp, inputs and packages only"
            ),
            "wasm_heap": f"maximum {plan.heap_max(request)} bytes",
            "javascript": (
                "unreachable from Python (js, pyodide, pyodide_js, ctypes, micropip removed; "
                "no JavaScript object left reachable); realm emptied of process, require, "
                "fetch; no code from strings"
            ),
            "node_permissions": (
                "files: Pyodide, /sandcell, /inputs, /packages read; workspace and /tmp "
                "read-write; no child processes, addons or WASI"
            ),
        }
        weakened = outer.weakened
        if request.mode is IsolationMode.RLIMITS:
            # No RLIMIT_AS here (host/rlimits.py): Node cannot start under one.
            wasm["rlimits"] = "cpu, open files, file size, core, processes"
            weakened = tuple(
                "cgroups: memory by the Wasm heap maximum (enforced by V8; no RLIMIT_AS: V8 "
                "reserves gigabytes of address space), processes by RLIMIT_NPROC"
                if w.startswith("cgroups:")
                else w
                for w in weakened
            )
        return replace(outer, backend=self.name, layers={**outer.layers, **wasm}, weakened=weakened)

    # -- the run -------------------------------------------------------------------------------

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        if sockets is not None:
            raise ConfigError(capabilities.NO_OUTSIDE)
        inner = self.inner_request(request)
        if self._pool is not None:
            pooled = self._pool.run(request, run_id=run_id, collect=collect, on_output=on_output)
            if isinstance(pooled, BackendResult):
                return pooled
        return self._run_cold(inner, run_id=run_id, collect=collect, on_output=on_output)

    def warm_stats(self) -> WarmReport | None:  # type: ignore[override]  # a pool of sandboxes
        return self._pool.stats() if self._pool is not None else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        super().close()

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        from sandcell.backends.wasm.session import WasmSessionSandbox

        if sockets is not None:
            raise ConfigError(capabilities.NO_OUTSIDE)
        return WasmSessionSandbox(self, request, session_id=session_id, restore=restore)


def probe() -> BackendStatus:
    """Whether this host can run the wasm rung: Node.js and the installed, pinned Pyodide."""
    try:
        found = dist.find()
    except IsolationUnavailable as exc:
        return BackendStatus(name="wasm", usable=False, detail=exc.reason, fix=exc.fix)
    snapshot = "memory snapshot ready" if found.snapshot else "no memory snapshot (slower starts)"
    return BackendStatus(
        name="wasm",
        usable=True,
        detail=f"{found.describe()}, in {found.directory}; {snapshot}; inside the namespaces "
        f"sandbox ({CONTROL_DIR} control files)",
        fix=None,
    )


def sweep_stale() -> list[str]:
    """The wasm rung's sandboxes are namespaces sandboxes: that rung's sweep removes them."""
    return []


__all__ = ["WasmBackend", "probe", "sweep_stale"]
