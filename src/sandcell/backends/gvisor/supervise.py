"""Supervising one gVisor sandbox from the moment its request is sent until it is gone.

The limits the host enforces here: wall time (from the agent's started marker, so a slow
sandbox start is not charged to the program; the start itself has its own bound), CPU time
(gVisor does not enforce RLIMIT_CPU: the sandbox's CPU usage, sentry included, is polled every
:data:`CPU_POLL_S` and the sandbox is killed at the limit), the stdout and stderr caps, and
cancellation. What the agent writes on stderr before its started marker is not the program's:
it is kept apart, as the reason of a sandbox that never started.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from sandcell.backends.base import OutputSink
from sandcell.backends.gvisor._agent import EXIT, STARTED
from sandcell.backends.gvisor.sandbox import GSandbox
from sandcell.backends.host.process import Launched, StopPipe
from sandcell.backends.host.supervise import STDERR, STDOUT, Watch, pump
from sandcell.spec import Limits

CPU_POLL_S = 0.05
SETUP_TIMEOUT_S = 60.0
_PRE_CAP = 65536
_AGENT = "agent"
_NEVER = float("inf")
_TRAILER_ROOM = len(EXIT) + 24
"""stderr may run this far over its cap before the run is stopped: the agent's exit trailer,
which is not the program's, ends it."""
_TRAILER = re.compile(re.escape(EXIT) + rb"(\d{1,10})\n\Z")
_TRAILER_TAIL = re.compile(rb"\d{0,10}\n?\Z")


class _Live:
    """What of the program's output ``on_output`` has been told: stdout as it is kept, stderr
    short of anything that may yet turn out to be the agent's exit trailer (not the program's:
    it starts with a NUL, so only a tail from the last NUL is ever held back)."""

    __slots__ = ("err", "sent_err", "sink", "stderr_cap")

    def __init__(self, sink: OutputSink | None, stderr_cap: int) -> None:
        self.sink = sink
        self.stderr_cap = stderr_cap
        self.sent_err = 0
        self.err = bytearray()
        """stderr as kept so far (the watch's buffer)."""

    def tell(self, stream: str, kept: bytes) -> None:
        """The watch's output sink: stdout as kept, stderr from its whole buffer."""
        if stream == STDOUT:
            if self.sink is not None:
                self.sink(STDOUT, kept)
        else:
            self.stderr()

    def stderr(self, *, final: bool = False) -> None:
        if self.sink is None:
            return
        err = self.err
        end = len(err) if final else len(err) - trailer_tail(bytes(err[self.sent_err :]))
        end = min(end, self.stderr_cap)
        if end > self.sent_err:
            self.sink("stderr", bytes(err[self.sent_err : end]))
            self.sent_err = end


def trailer_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` (stderr not yet passed on) may be the start of the
    agent's exit trailer: held back from live output until more comes or the stream ends."""
    nul = data.rfind(b"\0")
    if nul < 0:
        return 0
    tail = data[nul:]
    if len(tail) <= len(EXIT):
        maybe = EXIT.startswith(tail)
    else:
        maybe = tail.startswith(EXIT) and _TRAILER_TAIL.match(tail, len(EXIT)) is not None
    return len(tail) if maybe else 0


def supervise(
    sb: GSandbox,
    *,
    limits: Limits,
    stop: StopPipe,
    t0: float,
    cpu_ms: Callable[[], float | None],
    setup_timeout_s: float = SETUP_TIMEOUT_S,
    on_output: OutputSink | None = None,
) -> Launched:
    """Pump output under the caps until the sandbox exits or a limit ends it; then reap it.
    ``t0``: when the request was sent (the start of the measured wall time); ``on_output``:
    told the program's output as it is read (never the agent's own lines)."""
    live = _Live(on_output, limits.stderr_bytes)
    proc = sb.proc
    assert proc is not None and proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    # stderr is the agent's until its started marker, then the program's.
    open_fds = {out_fd: STDOUT, err_fd: _AGENT}
    pre = bytearray()
    watch = Watch(
        stdout_cap=limits.stdout_bytes,
        stderr_cap=limits.stderr_bytes,
        stderr_slack=_TRAILER_ROOM,
        deadline=t0 + setup_timeout_s,
        expiry="setup",
        on_output=None if on_output is None else live.tell,
    )
    err = watch.data[STDERR]
    live.err = err
    cpu_limit_ms = limits.cpu_time_s * 1000
    started = False
    next_cpu = time.monotonic() + CPU_POLL_S

    def agent(fd: int, _kind: str, chunk: bytes) -> None:
        """The agent's words until its started marker; the program's stderr from there."""
        nonlocal started
        pre.extend(chunk)
        at = pre.find(STARTED)
        if at < 0:
            del pre[: max(len(pre) - _PRE_CAP, 0)]
            return
        started = True
        open_fds[fd] = STDERR
        watch.deadline = time.monotonic() + limits.wall_time_s
        watch.expiry = "wall_time"
        rest = bytes(pre[at + len(STARTED) :])
        del pre[at:]
        if rest:
            watch.output(STDERR, rest)

    def cpu(now: float) -> float:
        """Poll the sandbox's CPU time once the program runs (gVisor has no RLIMIT_CPU)."""
        nonlocal next_cpu
        if not started:
            return _NEVER
        if now >= next_cpu:
            used = cpu_ms()
            if used is not None and used >= cpu_limit_ms:
                watch.stop("cpu_time")
            next_cpu = now + CPU_POLL_S
        return next_cpu

    pump(watch, open_fds, stop_fd=stop.r, other=agent, clock=cpu)
    stopped_by = watch.stopped_by
    out_trunc, err_trunc = watch.truncated[STDOUT], watch.truncated[STDERR]
    if stopped_by:
        sb.kill()
    sb.wait()
    wall_ms = (time.monotonic() - t0) * 1000
    code, sig = decode(sb.exit_status or 0)
    trailer = _TRAILER.search(err) if started and not err_trunc else None
    if trailer is not None:
        # The agent's report of the program's own wait status (see _agent.py).
        code, sig = decode_wait(int(trailer.group(1)))
        del err[trailer.start() :]
    if len(err) > limits.stderr_bytes:
        del err[limits.stderr_bytes :]
        err_trunc = True
        stopped_by = stopped_by or "stderr"
    if started:
        live.stderr(final=True)
    else:
        # Whatever runsc or the agent said is the reason it never started.
        err = pre
        if stopped_by == "setup":
            err += f"\nthe sandbox did not start within {setup_timeout_s:g} s".encode()
    return Launched(
        started=started,
        exit_code=code,
        signal=sig,
        stdout=bytes(watch.data[STDOUT]),
        stderr=bytes(err),
        stdout_truncated=out_trunc,
        stderr_truncated=err_trunc,
        stopped_by=None if stopped_by == "setup" else stopped_by,
        wall_ms=wall_ms,
        cpu_ms_rusage=sb.helper_cpu_ms,
        maxrss_bytes_rusage=sb.helper_maxrss,
    )


def decode_wait(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a raw wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def decode(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from runsc's wait status: runsc exits 128+N for a program killed by
    signal N, as shells do (runsc's own failures are 128 itself or below)."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    if 128 < code <= 128 + 64:
        return None, code - 128
    return code, None


__all__ = ["CPU_POLL_S", "SETUP_TIMEOUT_S", "decode", "decode_wait", "supervise"]
