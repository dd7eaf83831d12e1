"""How one cell of a session ended: its outcome, reason, exit code and signal. Pure.

The host knows a cell's end from the kernel's reply on the channel (``done`` with a status), from
what it did itself (the SIGINT at the cell's wall time or at an output cap), or from the kernel's
death (the boot reports its wait status; the cgroup says whether memory or CPU ran out).
"""

from __future__ import annotations

import signal

from sandcell.backends.host import cgroups
from sandcell.backends.host.process import decode_wait
from sandcell.spec import IsolationMode, Limits, Outcome

INTERRUPT_GRACE_S = 2.0
"""How long a cell has to return after the SIGINT at its time limit before the session is
killed."""
CANCEL_POLL_S = 0.1
"""How often a running cell's loop asks whether the cell was cancelled (see
:class:`CellCancel`)."""


class CellCancel:
    """Whether someone asked to stop the cell now running, and why.

    One per cell, made by the session and polled by the cell sandbox's loop, which then
    interrupts the cell exactly as at its wall time (SIGINT, the same grace, the session kept).
    Setting the reason from another thread is safe: it is one attribute, written once."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


Verdict = tuple[Outcome, str, int | None, int | None]
"""(outcome, reason, exit code, signal) of one cell."""

_ENDED = "; the session ended"


def classify_cell(
    *,
    reply: dict[str, object] | None,
    stopped_by: str | None,
    ended_why: str | None,
    timeout_s: float,
    limits: Limits,
    mode: IsolationMode,
    cg: cgroups.CgroupUsage | None,
    kernel_status: int | None,
    protocol_error: str | None,
    cancel: CellCancel | None = None,
) -> Verdict:
    """The verdict on a cell.

    ``stopped_by``: ``"wall_time"``, ``"stdout"`` or ``"stderr"`` when the host interrupted the
    cell, ``"cancel"`` when someone asked (``cancel`` says why). ``ended_why``: None while the
    session goes on, else ``"lifetime"`` (the session's end of life), ``"grace"`` (the
    interrupted cell did not return in time) or ``"kernel"`` (the
    kernel is gone: ``kernel_status`` is the wait status the boot reported, if any, and
    ``protocol_error`` says how the kernel broke the channel's protocol, if it did).
    """
    if ended_why == "lifetime":
        return Outcome.TIMEOUT, "the session reached its maximum lifetime" + _ENDED, None, None
    cancelled = f"cancelled: {cancel.reason if cancel is not None else 'asked to stop'}"
    if ended_why == "grace":
        outcome, what = {
            "wall_time": (Outcome.TIMEOUT, f"wall-time limit of {timeout_s:g} s reached"),
            "cancel": (Outcome.KILLED, cancelled),
        }.get(stopped_by or "", (Outcome.OUTPUT_LIMIT, f"{stopped_by} exceeded its cap"))
        return (
            outcome,
            f"{what} and the cell did not stop within {INTERRUPT_GRACE_S:g} s of the "
            "interrupt" + _ENDED,
            None,
            signal.SIGKILL,
        )
    if ended_why == "kernel":
        return _classify_death(limits, cg, kernel_status, protocol_error)
    assert reply is not None
    status = reply.get("status")
    if stopped_by == "wall_time" and status == "interrupted":
        return (
            Outcome.TIMEOUT,
            f"wall-time limit of {timeout_s:g} s reached; the cell was interrupted, the "
            "session and its state are kept",
            None,
            signal.SIGINT,
        )
    if stopped_by == "cancel" and status == "interrupted":
        return (
            Outcome.KILLED,
            f"{cancelled}; the cell was interrupted, the session and its state are kept",
            None,
            signal.SIGINT,
        )
    if stopped_by in ("stdout", "stderr"):
        cap = limits.stdout_bytes if stopped_by == "stdout" else limits.stderr_bytes
        return (
            Outcome.OUTPUT_LIMIT,
            f"{stopped_by} exceeded its cap of {cap} bytes; the cell was interrupted, the "
            "session is kept",
            None,
            signal.SIGINT,
        )
    if status == "ok":
        return Outcome.OK, "the cell ran to the end", 0, None
    if status == "exit":
        code = reply.get("exit_code")
        code = code if isinstance(code, int) else 1
        if code == 0:
            return Outcome.OK, "the cell called exit with status 0", 0, None
        return Outcome.ERROR, f"the cell called exit with status {code}", code, None
    error = reply.get("error")
    if error == "MemoryError" and mode is IsolationMode.RLIMITS:
        return (
            Outcome.MEMORY_LIMIT,
            f"address-space limit of {limits.memory_bytes} bytes reached (a limit of the "
            "whole session); the session is kept",
            1,
            None,
        )
    if status == "interrupted":
        return Outcome.ERROR, "the cell raised KeyboardInterrupt", 1, None
    return Outcome.ERROR, f"the cell raised {error}", 1, None


def _classify_death(
    limits: Limits,
    cg: cgroups.CgroupUsage | None,
    status: int | None,
    protocol_error: str | None,
) -> Verdict:
    code, sig = decode_wait(status) if status is not None else (None, None)
    if protocol_error is not None:
        return (
            Outcome.ERROR,
            f"the kernel broke its protocol ({protocol_error})" + _ENDED,
            None,
            None,
        )
    if cg is not None and cg.oom_killed:
        return (
            Outcome.MEMORY_LIMIT,
            f"memory limit of {limits.memory_bytes} bytes for the session reached, the "
            "kernel was killed" + _ENDED,
            None,
            sig,
        )
    if sig == signal.SIGXCPU or (
        sig == signal.SIGKILL
        and cg is not None
        and cg.cpu_ms is not None
        and cg.cpu_ms >= limits.cpu_time_s * 1000 * 0.98
    ):
        return (
            Outcome.TIMEOUT,
            f"CPU-time limit of {limits.cpu_time_s} s for the session reached" + _ENDED,
            None,
            sig,
        )
    if sig is not None:
        return (
            Outcome.KILLED,
            f"the session's interpreter was killed by signal {sig} "
            f"({signal.Signals(sig).name})" + _ENDED,
            None,
            sig,
        )
    return (
        Outcome.ERROR,
        f"the session's interpreter exited with status {code}" + _ENDED,
        code,
        None,
    )


__all__ = ["CANCEL_POLL_S", "INTERRUPT_GRACE_S", "CellCancel", "Verdict", "classify_cell"]
