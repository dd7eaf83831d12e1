"""How a sandboxed run ended, from what the launcher and the cgroup observed.

One place for the cold path and the warm starts, so that a run is classified the same way however
its sandbox was started: the order of the checks is the order of precedence (a cancelled run is
cancelled even if it also timed out; a wall-time kill is a timeout even if the kill was a signal).
"""

from __future__ import annotations

import signal

from sandcell.backends.base import BackendResult
from sandcell.backends.host import cgroups
from sandcell.backends.host.process import BOOT_FAILED_STATUS, Launched
from sandcell.spec import (
    Artifact,
    Enforcement,
    IsolationMode,
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
) -> BackendResult:
    """The backend's result: outcome, usage (the cgroup's where it has them, else rusage)."""
    outcome, reason = classify(launched, cg, request, cancel_reason=cancel_reason)
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
) -> tuple[Outcome, str]:
    limits = request.effective_limits
    if launched.stopped_by == "cancelled":
        # First: a run cancelled before its program started was still stopped on purpose.
        return Outcome.KILLED, f"cancelled: {cancel_reason or 'no reason given'}"
    if not launched.started and launched.stopped_by == "wall_time":
        # A limit shorter than the sandbox's own start: the caller's limit, not the host, ended it.
        return (
            Outcome.TIMEOUT,
            f"wall-time limit of {limits.wall_time_s:g} s reached before the program started",
        )
    if not launched.started:
        err = launched.stderr.decode(errors="replace").strip()
        if launched.exit_code == BOOT_FAILED_STATUS:
            return Outcome.INFRA_ERROR, f"the sandbox could not apply an isolation layer: {err}"
        return Outcome.INFRA_ERROR, f"the sandbox did not start the program: {err or 'no output'}"
    if launched.stopped_by == "wall_time":
        return Outcome.TIMEOUT, f"wall-time limit of {limits.wall_time_s:g} s reached"
    if launched.stopped_by in ("stdout", "stderr"):
        cap = limits.stdout_bytes if launched.stopped_by == "stdout" else limits.stderr_bytes
        return Outcome.OUTPUT_LIMIT, f"{launched.stopped_by} exceeded its cap of {cap} bytes"
    if cg is not None and cg.oom_killed:
        return Outcome.MEMORY_LIMIT, f"memory limit of {limits.memory_bytes} bytes reached"
    sig = launched.signal
    if sig in (signal.SIGXCPU, signal.SIGKILL) and _cpu_exhausted(launched, cg, limits.cpu_time_s):
        return Outcome.TIMEOUT, f"CPU-time limit of {limits.cpu_time_s} s reached"
    if sig is not None:
        return Outcome.KILLED, f"killed by signal {sig} ({signal.Signals(sig).name})"
    if (
        request.mode is IsolationMode.RLIMITS
        and launched.exit_code
        and launched.stderr.rstrip().endswith(b"MemoryError")
    ):
        return Outcome.MEMORY_LIMIT, f"address-space limit of {limits.memory_bytes} bytes reached"
    if launched.exit_code == 0:
        return Outcome.OK, "exited with status 0"
    return Outcome.ERROR, f"exited with status {launched.exit_code}"


def _cpu_exhausted(launched: Launched, cg: cgroups.CgroupUsage | None, cpu_s: int) -> bool:
    if launched.signal == signal.SIGXCPU:
        return True
    cpu_ms = cg.cpu_ms if cg and cg.cpu_ms is not None else launched.cpu_ms_rusage
    return cpu_ms >= cpu_s * 1000 * 0.98
