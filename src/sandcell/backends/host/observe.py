"""How a sandboxed run ended, from what the launcher and the cgroup observed.

One place for the cold path and the warm starts of the namespaces and gVisor rungs: what a launch
observed becomes a :class:`~sandcell.backends.host.outcome.Seen`, and the one classifier every
rung shares (``outcome.py``) names the outcome, in its one order of precedence.
"""

from __future__ import annotations

from sandcell.backends.base import BackendResult
from sandcell.backends.host import cgroups
from sandcell.backends.host.node_program import heap_exhausted
from sandcell.backends.host.outcome import V8_HEAP, Seen
from sandcell.backends.host.outcome import classify as outcome_of
from sandcell.backends.host.process import BOOT_FAILED_STATUS, Launched
from sandcell.spec import (
    Artifact,
    Enforcement,
    Outcome,
    RejectedExport,
    RunRequest,
    StartInfo,
    Usage,
)

__all__ = ["classify", "observed"]


def observed(
    launched: Launched,
    cg: cgroups.CgroupUsage | None,
    request: RunRequest,
    *,
    cancel_reason: str | None,
    artifacts: tuple[Artifact, ...],
    rejected: tuple[RejectedExport, ...],
    enforcement: Enforcement,
    start: StartInfo | None = None,
    heap_limit_bytes: int | None = None,
) -> BackendResult:
    """The backend's result: outcome, usage (the cgroup's where it has them, else rusage).
    ``heap_limit_bytes``: a memory maximum inside the sandbox (``Seen.heap_limit_bytes``)."""
    outcome, reason = classify(
        launched, cg, request, cancel_reason=cancel_reason, heap_limit_bytes=heap_limit_bytes
    )
    usage = Usage(
        wall_ms=round(launched.wall_ms, 3),
        cpu_ms=round(cg.cpu_ms, 3)
        if cg and cg.cpu_ms is not None
        else round(launched.cpu_ms_rusage, 3),
        peak_memory_bytes=cg.peak_memory_bytes
        if cg and cg.peak_memory_bytes is not None
        else launched.maxrss_bytes_rusage,
    )
    return BackendResult(
        outcome=outcome,
        exit_code=launched.exit_code,
        signal=launched.signal,
        stdout=launched.stdout,
        stderr=launched.stderr,
        stdout_truncated=launched.stdout_truncated,
        stderr_truncated=launched.stderr_truncated,
        usage=usage,
        artifacts=artifacts,
        rejected_exports=rejected,
        enforcement=enforcement,
        reason=reason,
        start=start or StartInfo(),
    )


def classify(
    launched: Launched,
    cg: cgroups.CgroupUsage | None,
    request: RunRequest,
    *,
    cancel_reason: str | None = None,
    heap_limit_bytes: int | None = None,
) -> tuple[Outcome, str]:
    """The outcome and its reason (:func:`sandcell.backends.host.outcome.classify`)."""
    limits = request.effective_limits
    code = launched.exit_code
    memory_error = bool(code) and launched.stderr.rstrip().endswith(b"MemoryError")
    v8_heap = heap_exhausted(launched.stderr, code, launched.signal, request.mode)
    seen = Seen(
        subject="run",
        limits=limits,
        mode=request.mode,
        wall_time_s=limits.wall_time_s,
        started=launched.started,
        stopped_by="cancel" if launched.stopped_by == "cancelled" else launched.stopped_by,
        cancel_reason=cancel_reason,
        boot_failed=code == BOOT_FAILED_STATUS,
        detail="" if launched.started else launched.stderr.decode(errors="replace").strip(),
        exit_code=code,
        signal=launched.signal,
        oom_killed=cg is not None and cg.oom_killed,
        cpu_ms=cg.cpu_ms if cg and cg.cpu_ms is not None else launched.cpu_ms_rusage,
        error="MemoryError" if memory_error else V8_HEAP if v8_heap else None,
        heap_limit_bytes=heap_limit_bytes,
    )
    outcome, reason, _, _ = outcome_of(seen)
    return outcome, reason
