"""Supervising a run from the host, for every rung: its output under the caps, its deadline, its
cancellation, and the first reason the host stopped it.

:class:`Watch` holds that state: what each stream kept under its cap (told to the run's output
sink as it is kept), the deadline and what passing it is called, and ``stopped_by``, the first
stop (a later one does not replace it, but a cancellation does). The rungs
whose sandbox talks through pipes (the namespaces cold and warm starts, gVisor) run it with
:func:`pump`, one loop: the rung supplies the descriptors and, where it needs them, what to do
with a descriptor that is not output (a status pipe, an agent's words before the program
starts), a clock of its own (gVisor's CPU-time polling) and a check after each batch (a warm
run's freeze). The microVM rung reads frames from its channel with the same :class:`Watch`.

The loop is the per-run hot path: one ``select`` per batch, no thread, no allocation beyond the
output kept and the ready list.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable

from sandcell.backends.base import OutputSink

__all__ = ["READ_CHUNK", "STDERR", "STDOUT", "Watch", "keep", "pump"]

STDOUT = "stdout"
STDERR = "stderr"
READ_CHUNK = 65536
"""The most read from a pipe at a time."""
_OUTPUTS = frozenset((STDOUT, STDERR))


def keep(
    buf: bytearray, cap: int, payload: bytes, stream: str, on_output: OutputSink | None
) -> bool:
    """Add to ``buf`` what of ``payload`` fits under ``cap`` and tell ``on_output`` that part,
    so that a sink never gets more than the stream's cap in all; False when the cap was passed."""
    part = payload[: max(cap - len(buf), 0)]
    buf += part
    if part and on_output is not None:
        on_output(stream, part)
    return len(part) == len(payload)


class Watch:
    """One run's supervision: its output kept under the caps, its deadline, its first stop.

    ``stderr_slack``: bytes stderr may hold past its cap before the run is stopped (gVisor's
    agent ends stderr with an exit trailer of its own, cut off after the run)."""

    __slots__ = (
        "caps",
        "data",
        "deadline",
        "expiry",
        "over",
        "sink",
        "stopped_by",
        "truncated",
    )

    def __init__(
        self,
        *,
        stdout_cap: int,
        stderr_cap: int,
        deadline: float,
        on_output: OutputSink | None = None,
        stderr_slack: int = 0,
        expiry: str = "wall_time",
    ) -> None:
        self.caps = {STDOUT: stdout_cap, STDERR: stderr_cap + stderr_slack}
        self.data = {STDOUT: bytearray(), STDERR: bytearray()}
        self.truncated = {STDOUT: False, STDERR: False}
        self.sink = on_output
        self.deadline = deadline
        self.expiry = expiry
        """The stop that passing the deadline is (``"wall_time"``; a rung may start with a
        setup deadline of another name)."""
        self.stopped_by: str | None = None
        self.over = False
        """The run's end was reported: a stop from now on does not count (its output is still
        kept under the caps)."""

    def output(self, stream: str, chunk: bytes) -> bool:
        """Keep what of ``chunk`` fits (and tell the sink); past the cap, mark the stream
        truncated and stop the run for it. True when the stream went over its cap."""
        if keep(self.data[stream], self.caps[stream], chunk, stream, self.sink):
            return False
        self.truncated[stream] = True
        self.stop(stream)
        return True

    def stop(self, reason: str) -> None:
        """Record why the host stops the run, unless it already stopped it."""
        if self.stopped_by is None and not self.over:
            self.stopped_by = reason

    def cancel(self) -> None:
        """A cancellation: it names the stop even after another (someone asked, and the outcome
        says so), until the run is over."""
        if not self.over:
            self.stopped_by = "cancelled"

    def expired(self, now: float) -> bool:
        """Whether the deadline passed (the run is then stopped for it)."""
        if now < self.deadline:
            return False
        self.stop(self.expiry)
        return True


def pump(
    watch: Watch,
    fds: dict[int, str],
    *,
    stop_fd: int | None,
    first: int | None = None,
    other: Callable[[int, str, bytes], None] | None = None,
    clock: Callable[[float], float] | None = None,
    after: Callable[[], bool] | None = None,
) -> None:
    """Read ``fds`` (descriptor -> ``"stdout"``, ``"stderr"`` or a kind of the rung's) until they
    all close or the run is stopped: at the deadline, at a cap, or by a byte on ``stop_fd`` (a
    cancellation). A descriptor is dropped from ``fds`` at its end-of-file.

    ``first``: read before the others of a batch (a status pipe, whose news was written before the
    program could print). ``other(fd, kind, chunk)``: what a descriptor that is not output read;
    it may change the kinds in ``fds`` and the watch's deadline. ``clock(now)``: the rung's own
    check, which may stop the run; it returns the latest time to wake up for it. ``after()``:
    checked after each batch; True ends the loop without a stop (the run is over by other news).
    """
    stop_fds = [stop_fd] if stop_fd is not None else []
    while fds:
        now = time.monotonic()
        if watch.expired(now):
            return
        wake = watch.deadline
        if clock is not None:
            wake = min(wake, clock(now))
            if watch.stopped_by is not None:
                return
        ready, _, _ = select.select([*fds, *stop_fds], [], [], max(wake - now, 0))
        if stop_fds and stop_fd in ready:
            watch.cancel()
            return
        if first is not None and len(ready) > 1:
            ready.sort(key=lambda fd: fd != first)
        for fd in ready:
            chunk = os.read(fd, READ_CHUNK)
            kind = fds[fd]
            if not chunk:
                del fds[fd]
            elif kind in _OUTPUTS:
                watch.output(kind, chunk)
            elif other is not None:
                other(fd, kind, chunk)
        if watch.stopped_by is not None or (after is not None and after()):
            return
