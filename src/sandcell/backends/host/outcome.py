"""How a run or a session's cell ended: one order of precedence for every rung. Pure.

Each caller says what it observed in a :class:`Seen` (``observe.py`` for a launched process on
the namespaces and gVisor rungs, ``microvm/drive.py`` for a run in a VM,
``backends/cell/verdict.py`` for a cell) and :func:`classify` names the outcome. The order of the
checks is the order of precedence, written once here so the rungs cannot drift apart:

1. the session's end of life, then a stopped cell that did not answer in its grace (cells);
2. a cancellation (a cancelled run is cancelled even if it also timed out);
3. a sandbox that did not start the program, or failed before it reported;
4. a kernel that broke its channel's protocol (cells);
5. the host's stops: the wall time, then the output caps (a wall-time kill is a timeout even if
   the kill was a signal);
6. what the process's death says: the cgroup's OOM kill, the CPU time, a signal;
7. a live cell's reply from its kernel (an address-space limit among its errors);
8. an address-space limit reached (``rlimits`` mode, where no cgroup counts memory), else the
   exit status.

A run's end is always a process's death. A cell's is a reply from its kernel, which lives on (the
host's stop counts only where the kernel answered it), unless the kernel died: then its death
decides, as a run's does.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from sandcell.spec import IsolationMode, Limits, Outcome

__all__ = ["CPU_SPENT", "V8_HEAP", "Seen", "Verdict", "classify"]

Verdict = tuple[Outcome, str, int | None, int | None]
"""(outcome, reason, exit code, signal)."""

CPU_SPENT = 0.98
"""The share of the CPU-time limit from which a SIGKILL counts as the limit reached (the cgroup's
and rusage's clocks tick a little behind the kernel's own enforcement)."""

V8_HEAP = "V8 heap"
"""``Seen.error`` of a Node program that aborted for want of memory (``node_program.py``): V8
sizes its heap from the memory limit (the cgroup's, or ``--max-old-space-size`` in the
``rlimits`` mode, where RLIMIT_AS also refuses), so the limit was reached even though the kernel
did not kill it."""

_OUTPUTS = ("stdout", "stderr")
_ENDED = "; the session ended"
_INTERRUPTED = "; the cell was interrupted, the session"
_INT = (None, signal.SIGINT)
"""The exit code and signal of a cell the host interrupted and whose kernel answered."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """What the host observed of the end of one run or one cell."""

    subject: Literal["run", "cell"]
    limits: Limits
    """The limits the reasons name (a cell's are its session's)."""
    mode: IsolationMode
    wall_time_s: float
    """The wall-time limit the reasons name (a cell's own timeout)."""
    started: bool = True
    """The sandbox handed the program over (a cell's kernel is running)."""
    stopped_by: str | None = None
    """``"wall_time"``, ``"stdout"``, ``"stderr"`` or ``"cancel"`` when the host stopped it."""
    cancel_reason: str | None = None
    ended: str | None = None
    """A cell's session ended: ``"lifetime"``, ``"grace"`` (the stopped cell did not return in
    time, ``grace_s``) or ``"kernel"`` (the kernel is gone). None for a run."""
    grace_s: float = 0.0
    reported: bool = True
    """The sandbox reported how the program ended (a VM's agent may fail to)."""
    failure: str | None = None
    """Why the sandbox could not go on (a VM's agent or channel), if it could not."""
    sandbox_died: bool = False
    """The sandbox itself stopped during the run (a VM's kernel or QEMU)."""
    boot_failed: bool = False
    """The boot could not apply an isolation layer."""
    detail: str = ""
    """What the sandbox said about its failure to start (its stderr, a VM's console)."""
    protocol_error: str | None = None
    """How a cell's kernel broke its channel's protocol."""
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    cpu_ms: float | None = None
    """CPU time spent, where known (the cgroup's, else rusage's or the guest's)."""
    status: str | None = None
    """A cell's reply: ``"ok"``, ``"exit"``, ``"error"`` or ``"interrupted"``."""
    error: str | None = None
    """The exception a cell raised; for a run, ``"MemoryError"`` when it failed with one, or
    :data:`V8_HEAP` when V8 aborted it on a full heap (``node_program.heap_exhausted``)."""
    heap_limit_bytes: int | None = None
    """A memory maximum enforced inside the sandbox below the cgroup's (the wasm rung's Wasm
    heap): a MemoryError is then that limit reached, not a bug of the program."""


def classify(seen: Seen) -> Verdict:
    """The outcome, its reason, and the exit code and signal to report."""
    cell = seen.subject == "cell"
    lim = seen.limits
    if seen.ended == "lifetime":
        return Outcome.TIMEOUT, "the session reached its maximum lifetime" + _ENDED, None, None
    cancelled = f"cancelled: {seen.cancel_reason or 'no reason given'}"
    if seen.ended == "grace":
        outcome, what = {
            "wall_time": (Outcome.TIMEOUT, f"wall-time limit of {seen.wall_time_s:g} s reached"),
            "cancel": (Outcome.KILLED, cancelled),
        }.get(
            seen.stopped_by or "",
            (Outcome.OUTPUT_LIMIT, f"{seen.stopped_by} exceeded its cap"),
        )
        return (
            outcome,
            f"{what} and the cell did not stop within {seen.grace_s:g} s of the interrupt" + _ENDED,
            None,
            signal.SIGKILL,
        )
    died = not cell or seen.ended == "kernel"
    stop = _stop(seen, died)
    if stop == "cancel":
        if cell:
            return Outcome.KILLED, f"{cancelled}{_INTERRUPTED} and its state are kept", *_INT
        return Outcome.KILLED, cancelled, seen.exit_code, seen.signal
    if not seen.started or (seen.failure and not seen.reported and seen.stopped_by is None):
        return (*_not_started(seen), seen.exit_code, seen.signal)
    if died and seen.protocol_error is not None:
        why = f"the kernel broke its protocol ({seen.protocol_error})" + _ENDED
        return Outcome.ERROR, why, None, None
    if stop == "wall_time":
        what = f"wall-time limit of {seen.wall_time_s:g} s reached"
        if cell:
            return Outcome.TIMEOUT, f"{what}{_INTERRUPTED} and its state are kept", *_INT
        return Outcome.TIMEOUT, what, seen.exit_code, seen.signal
    if stop in _OUTPUTS:
        cap = lim.stdout_bytes if stop == "stdout" else lim.stderr_bytes
        what = f"{stop} exceeded its cap of {cap} bytes"
        if cell:
            return Outcome.OUTPUT_LIMIT, f"{what}{_INTERRUPTED} is kept", *_INT
        return Outcome.OUTPUT_LIMIT, what, seen.exit_code, seen.signal
    if died:
        death = _death(seen, cell)
        if death is not None:
            return death
    if not died:
        return _reply(seen)
    if not cell and seen.heap_limit_bytes is not None and seen.error == "MemoryError":
        what = f"Wasm heap maximum of {seen.heap_limit_bytes} bytes reached"
        return Outcome.MEMORY_LIMIT, what, seen.exit_code, seen.signal
    if not cell and seen.mode is IsolationMode.RLIMITS and seen.error == "MemoryError":
        what = f"address-space limit of {lim.memory_bytes} bytes reached"
        return Outcome.MEMORY_LIMIT, what, seen.exit_code, seen.signal
    code = seen.exit_code
    if cell:
        return (
            Outcome.ERROR,
            f"the session's interpreter exited with status {code}" + _ENDED,
            code,
            None,
        )
    if code == 0:
        return Outcome.OK, "exited with status 0", code, seen.signal
    return Outcome.ERROR, f"exited with status {code}", code, seen.signal


def _stop(seen: Seen, died: bool) -> str | None:
    """The host's stop that decides the outcome, if one does: any stop of a run; a cell's only
    where its kernel lives and answered it (an output cap whatever the reply; the wall time or a
    cancel with "interrupted")."""
    if seen.subject == "run":
        return seen.stopped_by
    if died:
        return None
    if seen.stopped_by in _OUTPUTS or seen.status == "interrupted":
        return seen.stopped_by
    return None


def _not_started(seen: Seen) -> tuple[Outcome, str]:
    if not seen.started and seen.stopped_by == "wall_time":
        # A limit shorter than the sandbox's own start: the caller's limit, not the host, ended it.
        return (
            Outcome.TIMEOUT,
            f"wall-time limit of {seen.wall_time_s:g} s reached before the program started",
        )
    if seen.started and seen.sandbox_died:
        return (
            Outcome.KILLED,
            f"{seen.failure} (guest kernel crash or QEMU died): {seen.detail}",
        )
    if seen.boot_failed:
        return Outcome.INFRA_ERROR, f"the sandbox could not apply an isolation layer: {seen.detail}"
    if seen.failure is None:
        why = seen.detail or "no output"
        return Outcome.INFRA_ERROR, f"the sandbox did not start the program: {why}"
    return Outcome.INFRA_ERROR, f"{seen.failure}{': ' + seen.detail if seen.detail else ''}"


def _death(seen: Seen, cell: bool) -> Verdict | None:
    """The outcome a process's death names (memory, CPU time, a signal), if it names one."""
    lim, sig = seen.limits, seen.signal
    if seen.oom_killed:
        if cell:
            what = f"memory limit of {lim.memory_bytes} bytes for the session reached, the kernel"
            return Outcome.MEMORY_LIMIT, f"{what} was killed" + _ENDED, None, sig
        what = f"memory limit of {lim.memory_bytes} bytes reached"
        return Outcome.MEMORY_LIMIT, what, seen.exit_code, sig
    if seen.error == V8_HEAP:
        what = (
            f"memory limit of {lim.memory_bytes} bytes reached: Node.js could not allocate more "
            "and aborted (V8 sizes its heap from the memory limit: JavaScript heap out of memory)"
            if seen.mode is not IsolationMode.RLIMITS
            else f"address-space limit of {lim.memory_bytes} bytes reached (and what V8 reserves "
            "unused above it): Node.js could not allocate more and aborted"
        )
        if cell:
            return Outcome.MEMORY_LIMIT, what + _ENDED, None, sig
        return Outcome.MEMORY_LIMIT, what, seen.exit_code, sig
    spent = seen.cpu_ms is not None and seen.cpu_ms >= lim.cpu_time_s * 1000 * CPU_SPENT
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and spent):
        if cell:
            what = f"CPU-time limit of {lim.cpu_time_s} s for the session reached"
            return Outcome.TIMEOUT, what + _ENDED, None, sig
        return Outcome.TIMEOUT, f"CPU-time limit of {lim.cpu_time_s} s reached", seen.exit_code, sig
    if sig is not None:
        name = f"signal {sig} ({signal.Signals(sig).name})"
        if cell:
            return (
                Outcome.KILLED,
                f"the session's interpreter was killed by {name}" + _ENDED,
                None,
                sig,
            )
        return Outcome.KILLED, f"killed by {name}", seen.exit_code, sig
    return None


def _reply(seen: Seen) -> Verdict:
    """A cell's end as its kernel reported it (the kernel lives on)."""
    if seen.status == "ok":
        return Outcome.OK, "the cell ran to the end", 0, None
    if seen.status == "exit":
        code = seen.exit_code
        if code == 0:
            return Outcome.OK, "the cell called exit with status 0", 0, None
        return Outcome.ERROR, f"the cell called exit with status {code}", code, None
    if seen.heap_limit_bytes is not None and seen.error == "MemoryError":
        return (
            Outcome.MEMORY_LIMIT,
            f"Wasm heap maximum of {seen.heap_limit_bytes} bytes reached (a limit of the whole "
            "session); the session is kept",
            1,
            None,
        )
    if seen.mode is IsolationMode.RLIMITS and seen.error == "MemoryError":
        return (
            Outcome.MEMORY_LIMIT,
            f"address-space limit of {seen.limits.memory_bytes} bytes reached (a limit of the "
            "whole session); the session is kept",
            1,
            None,
        )
    if seen.status == "interrupted":
        return Outcome.ERROR, "the cell raised KeyboardInterrupt", 1, None
    return Outcome.ERROR, f"the cell raised {seen.error}", 1, None
