"""The backend interface: one small protocol every isolation engine implements.

A rung (``backends/<rung>/``) implements :class:`Backend` whole: runs, cancel, the warm starts'
report, and a live sandbox for a session (whose contract is :mod:`sandcell.backends.cell`).
Callers hold a :class:`Backend` and never ask which rung it is; what needs no built backend (the
host probe, the sweep of what dead supervisors left) is reached by name through
:mod:`sandcell.backends.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sandcell.spec import (
    Artifact,
    DisplayOutput,
    Enforcement,
    Outcome,
    RejectedExport,
    RunRequest,
    StartInfo,
    Usage,
)

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint
    from sandcell.backends.warm import WarmReport
    from sandcell.run_sockets import SandboxSockets

Collector = Callable[[Path], tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]]
"""Called with the workspace, while it still exists and no sandbox process is alive, to export."""

OutputSink = Callable[[str, bytes], None]
"""Told each piece of the program's output as the backend reads it: ``("stdout" | "stderr",
raw bytes)``, from a backend thread, in order per stream, never more than the stream's cap in
all. It must return quickly and not raise; the executor's wrapper decodes, redacts and caps
before anything reaches a caller (:mod:`sandcell.live_output`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendResult:
    """What a backend observed; the executor adds identity, validation and the record."""

    outcome: Outcome
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    usage: Usage
    artifacts: tuple[Artifact, ...]
    rejected_exports: tuple[RejectedExport, ...]
    enforcement: Enforcement
    reason: str
    outputs: tuple[DisplayOutput, ...] = ()
    start: StartInfo = field(default_factory=StartInfo)

    @classmethod
    def not_run(cls, outcome: Outcome, reason: str, enforcement: Enforcement) -> BackendResult:
        """The result of a run that never started: no output, no usage, no exports."""
        return cls(
            outcome=outcome,
            exit_code=None,
            signal=None,
            stdout=b"",
            stderr=b"",
            stdout_truncated=False,
            stderr_truncated=False,
            usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
            artifacts=(),
            rejected_exports=(),
            enforcement=enforcement,
            reason=reason,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendStatus:
    """Whether this host can run a backend, as ``sandcell doctor`` reports it."""

    name: str
    usable: bool
    detail: str
    """What was found: versions, paths, the error of a failed probe."""
    fix: str | None
    """How to make it usable; set whenever ``usable`` is false."""


def started_cold(result: BackendResult, why: str) -> BackendResult:
    """A run that was to start warm but started cold: ``why`` goes into its enforcement report
    (``layers["warm_start"]``), so the record says so."""
    layers = {**result.enforcement.layers, "warm_start": f"not used: {why}"}
    return replace(result, enforcement=replace(result.enforcement, layers=layers))


class Backend(Protocol):
    """An isolation engine: ``run`` starts a fresh sandbox, runs one program, destroys it."""

    name: str

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        """Run ``request``; with ``sockets`` (its profile reaches outside), make them reachable
        inside the sandbox as :mod:`sandcell.run_sockets` says, or raise IsolationUnavailable.
        With ``on_output``, tell it the program's output as it is read (:data:`OutputSink`)."""
        ...

    def versions(self) -> Mapping[str, str]:
        """Versions of the pieces that make up the boundary (for the run record)."""
        ...

    def cancel_all(self, reason: str) -> int:
        """Stop every run in flight, from any thread; returns how many were told to stop.

        Each ends with outcome ``killed`` and a reason ``"cancelled: <reason>"``, after the
        backend has cleaned up as after any other run. Runs started later are not affected.
        """
        ...

    def cancel(self, run_id: str, reason: str) -> bool:
        """Stop the run ``run_id`` (the id given to :meth:`run`) if it is in flight now, as
        :meth:`cancel_all` would; False when it is not (yet, or any more) running here."""
        ...

    def warm_stats(self) -> WarmReport | None:
        """The warm template or pool as it is now (:mod:`sandcell.backends.warm`); None when
        this backend was built without warm starts."""
        ...

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        """A live sandbox for one session, not started yet (:class:`~sandcell.backends.cell.
        CellSandbox`), reaching ``sockets`` (the session's egress proxy and tool gateway) when
        given; with ``restore``, its :meth:`~sandcell.backends.cell.CellSandbox.start` brings
        back the state that point names instead of starting empty. Raises IsolationUnavailable
        or ConfigError when ``request`` cannot have one."""
        ...

    def close(self) -> None: ...


__all__ = ["Backend", "BackendResult", "BackendStatus", "Collector", "OutputSink", "started_cold"]
