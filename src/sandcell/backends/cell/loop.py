"""One cell's supervision, the same on every rung: its deadlines, caps, cancel and interrupt.

A rung's live sandbox (:mod:`sandcell.backends.cell`) sends a cell to its kernel and
then watches it until the kernel replies or the session must end. What to watch and in which
order is the same everywhere, so it is decided here once, by :func:`supervise_cell`; how to reach
the kernel is the rung's, behind a small :class:`CellRung` adapter (send the message, hand over
the kernel's next message, read output for a while, interrupt the kernel, settle after the
reply, and optionally a periodic check of a limit the rung enforces from the host).

The order of precedence, checked on every turn:

1. the kernel's messages first: its reply ends the loop, its ``started`` may make a requested
   interrupt due (:class:`~sandcell.backends.cell.interrupt.CellInterrupt`: one SIGINT per cell,
   never before the kernel started it);
2. the session's end of life (``hard_deadline``): the session ends (``"lifetime"``);
3. the rung's periodic check (gVisor's CPU time): a limit reached ends the session
   (``"kernel"``);
4. a cancel: the cell is interrupted, with :data:`~sandcell.backends.cell.verdict.INTERRUPT_GRACE_S`
   to return;
5. output for up to the nearest deadline: the kernel gone ends the session (``"kernel"``), an
   output cap passed interrupts the cell (the first reason to stop is the one reported);
6. the wall time: the cell is interrupted; an interrupted cell past its grace ends the session
   (``"grace"``).

What it returns (:class:`CellEnd`) is what :func:`~sandcell.backends.cell.verdict.classify_cell`
needs besides the rung's own observations (usage, the kernel's wait status).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

from sandcell.backends.cell.interrupt import CellInterrupt
from sandcell.backends.cell.verdict import CANCEL_POLL_S, INTERRUPT_GRACE_S, CellCancel

__all__ = ["CellEnd", "CellRung", "supervise_cell"]


class CellRung(Protocol):
    """How the loop reaches one cell's kernel on one rung (made per cell: it holds the cell's
    captured output). The defaults suit a rung without host-side checks; a rung subclasses
    this explicitly to inherit them."""

    check_every_s: float | None = None
    """How often :meth:`exhausted` is asked while the cell runs (None: never)."""
    reads_past_end: bool = False
    """Whether kernel messages already queued when :meth:`pump` reports the end are read
    before the end is taken (the microVM's frames come in batches: output, the reply, then
    the kernel's end)."""

    def send(self, message: bytes) -> None:
        """Send the cell's framed message to the kernel. A kernel that is gone refuses it
        silently: :meth:`pump` then reports the end."""
        ...

    def next_message(self) -> dict[str, object] | None:
        """The kernel's next message already received, or None."""
        ...

    def pump(self, timeout_s: float) -> str | None:
        """Read the channel and the cell's output for up to ``timeout_s``: ``"ended"`` once
        the kernel or its sandbox is gone, ``"stdout"``/``"stderr"`` when that stream's cap
        was passed, else None."""
        ...

    def interrupt(self) -> None:
        """Deliver one SIGINT to the kernel (the loop decides when: at most once a cell)."""
        ...

    def exhausted(self) -> bool:
        """Whether a limit the rung checks from the host is reached (the session then ends)."""
        return False

    def settle(self) -> None:
        """After the reply: collect what belongs to the cell and is already on its way (output
        written before the reply, the usage that follows it)."""
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CellEnd:
    """How the loop left one cell (the arguments of the same name of
    :func:`~sandcell.backends.cell.verdict.classify_cell`)."""

    reply: dict[str, object] | None
    """The kernel's ``done`` message, or None when the session ended first."""
    stopped_by: str | None
    """``"wall_time"``, ``"stdout"``, ``"stderr"`` or ``"cancel"`` when the host stopped the
    cell, else None."""
    ended_why: str | None
    """None while the session goes on, else ``"lifetime"``, ``"grace"`` or ``"kernel"``."""
    wall_ms: float
    """From the message's sending to the reply (or to the end), in milliseconds."""


def supervise_cell(
    rung: CellRung,
    message: bytes,
    *,
    cell_id: int,
    timeout_s: float,
    hard_deadline: float | None,
    cancel: CellCancel | None = None,
) -> CellEnd:
    """Send cell ``cell_id``'s ``message`` through ``rung`` and watch it until the kernel's
    reply or the session's end: at most ``timeout_s`` of wall time, the whole session ended
    at the monotonic ``hard_deadline``, interrupted once ``cancel`` holds a reason (see the
    module for the order). A rung whose kernel ended is left to the caller to kill."""
    t0 = time.monotonic()
    rung.send(message)
    deadline = t0 + timeout_s
    every = rung.check_every_s
    next_check = t0 if every is not None else math.inf
    stopped_by: str | None = None
    reply: dict[str, object] | None = None
    ended_why: str | None = None
    interrupt = CellInterrupt(cell_id)
    held: dict[str, object] | None = None
    while reply is None:
        msg: dict[str, object] | None
        if held is not None:
            msg, held = held, None
        else:
            msg = rung.next_message()
        if msg is not None:
            if msg.get("op") == "done" and msg.get("id") == cell_id:
                reply = msg
            elif interrupt.saw(msg):
                rung.interrupt()
                deadline = max(deadline, time.monotonic() + INTERRUPT_GRACE_S)
            continue
        now = time.monotonic()
        if hard_deadline is not None and now >= hard_deadline:
            ended_why = "lifetime"
            break
        if every is not None and now >= next_check:
            if rung.exhausted():
                ended_why = "kernel"
                break
            next_check = now + every
        cancellable = cancel is not None and stopped_by in (None, "cancel")
        if cancellable and cancel is not None and cancel.reason is not None:
            if stopped_by is None:
                stopped_by, deadline = "cancel", now + INTERRUPT_GRACE_S
            if interrupt.request():
                rung.interrupt()
                deadline = max(deadline, time.monotonic() + INTERRUPT_GRACE_S)
        limit = min(deadline, next_check)
        if hard_deadline is not None:
            limit = min(limit, hard_deadline)
        if cancellable:
            limit = min(limit, now + CANCEL_POLL_S)
        event = rung.pump(limit - now)
        if event == "ended":
            held = rung.next_message() if rung.reads_past_end else None
            if held is not None:
                continue
            ended_why = "kernel"
            break
        if event in ("stdout", "stderr") and stopped_by is None:
            stopped_by = event
            if interrupt.request():
                rung.interrupt()
            deadline = time.monotonic() + INTERRUPT_GRACE_S
        elif event is None and time.monotonic() >= deadline:
            if stopped_by is not None:
                ended_why = "grace"
                break
            stopped_by = "wall_time"
            if interrupt.request():
                rung.interrupt()
            deadline = time.monotonic() + INTERRUPT_GRACE_S
    wall_ms = (time.monotonic() - t0) * 1000
    if reply is not None:
        rung.settle()
    return CellEnd(reply=reply, stopped_by=stopped_by, ended_why=ended_why, wall_ms=wall_ms)
