"""How one cell of a session ended: its outcome, reason, exit code and signal. Pure.

The host knows a cell's end from the kernel's reply on the channel (``done`` with a status), from
what it did itself (the SIGINT at the cell's wall time or at an output cap), or from the kernel's
death (the boot reports its wait status; the cgroup says whether memory or CPU ran out). What it
saw goes to the classifier every rung shares (``backends/host/outcome.py``), which also judges
runs, in one order of precedence.
"""

from __future__ import annotations

from sandcell.backends.host import cgroups
from sandcell.backends.host.node_program import heap_exhausted
from sandcell.backends.host.outcome import V8_HEAP, Seen, Verdict, classify
from sandcell.backends.host.process import decode_wait
from sandcell.spec import IsolationMode, Limits

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
    heap_limit_bytes: int | None = None,
    stderr: bytes = b"",
) -> Verdict:
    """The verdict on a cell, by the classifier every rung shares
    (:func:`sandcell.backends.host.outcome.classify`).

    ``stopped_by``: ``"wall_time"``, ``"stdout"`` or ``"stderr"`` when the host interrupted the
    cell, ``"cancel"`` when someone asked (``cancel`` says why). ``ended_why``: None while the
    session goes on (``reply`` is then the kernel's), else ``"lifetime"`` (the session's end of
    life), ``"grace"`` (the interrupted cell did not return in time) or ``"kernel"`` (the
    kernel is gone: ``kernel_status`` is the wait status the boot reported, if any, and
    ``protocol_error`` says how the kernel broke the channel's protocol, if it did).
    ``stderr``: the cell's, where a Node kernel that V8 aborted on a full heap said so (V8
    sizes its heap from the memory limit: that limit was reached, not a crash).
    """
    status: object = None
    error: object = None
    code: int | None = None
    if ended_why == "kernel":
        code, sig = decode_wait(kernel_status) if kernel_status is not None else (None, None)
        if heap_exhausted(stderr, code, sig, mode):
            error = V8_HEAP
    else:
        sig = None
        if ended_why is None:
            assert reply is not None
            status, error = reply.get("status"), reply.get("error")
            if status == "exit":
                raw = reply.get("exit_code")
                code = raw if isinstance(raw, int) else 1
    seen = Seen(
        subject="cell",
        limits=limits,
        mode=mode,
        wall_time_s=timeout_s,
        stopped_by=stopped_by,
        cancel_reason=cancel.reason if cancel is not None else "asked to stop",
        ended=ended_why,
        grace_s=INTERRUPT_GRACE_S,
        protocol_error=protocol_error,
        exit_code=code,
        signal=sig,
        oom_killed=cg is not None and cg.oom_killed,
        cpu_ms=cg.cpu_ms if cg is not None else None,
        # A reply is the kernel's JSON: its words are named as sent.
        status=None if status is None else str(status),
        error=None if error is None else str(error),
        heap_limit_bytes=heap_limit_bytes,
    )
    return classify(seen)


__all__ = ["CANCEL_POLL_S", "INTERRUPT_GRACE_S", "CellCancel", "Verdict", "classify_cell"]
