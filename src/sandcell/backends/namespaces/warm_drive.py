"""One warm run on one child: send the request, pump the output under the limits, read pid 1's
status report, export the workspace.

The host side of the per-run hot path (``WarmStarter`` takes or forks the child and records the
result). Measured on the 2-core development host, loaded by other work (medians;
``bench/bench_warm.py`` for the backend call, ``Executor.run`` for call to result; before vs
after commit cadb9c7: pool entries prepared before take, teardown off the call path):

================================  ==========  ==========
pool mode                         before      after
================================  ==========  ==========
backend, print(1)                 39.5 ms     11.9 ms
backend, pandas snippet           45.2 ms     17.7 ms
Executor.run, print(1)            40.7 ms     16.7 ms
Executor.run, pandas snippet      46.8 ms     22.3 ms
Executor.run, pandas, display     cold        24.1 ms
idle pooled sandbox, PSS          13.5 MiB    10.4 MiB
================================  ==========  ==========

Where the ~17 ms of a pooled print(1) go now (host timestamps): executor before the backend
(admission, which is the analysis of the code itself) ~0.8 ms; request sent to program started
2-8 ms (pid 1's mounts, prlimit, its own capability drop and seccomp, the hand-over to the
program: under 1 ms of CPU, the rest is three processes waking each other on two busy cores);
the program ~1.5 ms; its exit 3-10 ms: the kernel tears down the copy of the pandas-sized image
before pid 1 can reap it, and pid 1 reports only then (the exports are read from a quiet
workspace); status read to return ~1 ms plus the record (validation and audit append) ~1.7 ms.

Since then the exit is off the result path where the run's cgroup can be frozen: the program's
process reports its end and stops (``_zygote.py`` step 6), pid 1 writes ``D<code>`` on the status
pipe, and this side freezes the cgroup (~0.3 ms on cgroup v1), drains the pipes without waiting
for an end-of-file that frozen writers never give, reads the exports from the frozen workspace
and returns; the kill, the thaw and the exit's page-table teardown happen in the background
teardown. Interleaved in one process on the same loaded host (load average 7-9, 30 runs each,
Executor.run of a pooled run with numpy+pandas preloaded): pandas snippet 40.4 -> 31.7 ms, print(1)
25.7 -> 18.6 ms at the median. What is left (the same measurement with host timestamps): the
hand-off (request to program start, three processes waking each other), the program itself
(copy-on-write faults on the template's pages: 3.5-6 ms for the pandas snippet in a freshly
forked interpreter outside any sandbox, at load average 1.5-2), the end report (the program's
epilogue, then two wake-ups) and the executor's own work (policy analysis, record). The 3 ms
target stays out of reach on this host: the program alone takes longer in a forked interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandcell.backends.base import Collector, OutputSink
from sandcell.backends.host.layout import SANDBOX_WORKDIR
from sandcell.backends.host.process import Launched
from sandcell.backends.host.supervise import READ_CHUNK, STDERR, STDOUT, Watch, pump
from sandcell.backends.namespaces.launcher import _stdin_fd
from sandcell.backends.namespaces.template import WarmChild, send_message
from sandcell.errors import InfraError
from sandcell.spec import RunRequest

__all__ = ["drive", "parse_done", "parse_status"]


def parse_status(data: bytes) -> tuple[bool, int | None, float, int]:
    """(started, wait status, cpu ms, max rss bytes) from the status pipe's bytes."""
    started = data.startswith(b"1")
    _, marker, rest = data.partition(b"W")
    if not marker or not rest.endswith(b"\n"):
        return started, None, 0.0, 0
    try:
        status, cpu, rss = rest.split()
        return started, int(status), float(cpu), int(rss)
    except ValueError:
        return started, None, 0.0, 0


def parse_done(data: bytes) -> int | None:
    """The exit code in pid 1's early report (``D<code>\\n``, between ``1`` and ``W``), or None."""
    _, marker, rest = data.partition(b"W")[0].partition(b"D")
    code, newline, _tail = rest.partition(b"\n")
    if not marker or not newline or not code.isdigit() or len(code) > 3:
        return None
    return int(code) & 0xFF


def drive(
    child: WarmChild,
    doc: dict[str, Any],
    request: RunRequest,
    trees: list[int],
    collect: Collector,
    *,
    stop_fd: int,
    quiesce: Callable[[], bool] | None = None,
    on_output: OutputSink | None = None,
) -> tuple[Launched, tuple[Any, ...], tuple[Any, ...]]:
    """Send the request, pump the output under the limits, read the status, export.

    With ``quiesce`` (freezes the run's cgroup; True once nothing of it runs) the request asks
    the program's process to stop itself when the program ended, and pid 1 to say so (``D``):
    the result and the exports are then read from the frozen sandbox, and the exit of its
    processes is left to the teardown. When the freeze fails, the run is ended as a stopped one
    (pid 1 kills everything, reports, and the exports are read after that report)."""
    limits = request.effective_limits
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    st_r, st_w = os.pipe2(os.O_CLOEXEC)
    stdin = _stdin_fd(request.stdin)
    ours = [out_r, err_r, st_r]
    try:
        try:
            send_message(child.sock, json.dumps(doc).encode(), [stdin, out_w, err_w, st_w, *trees])
        except OSError as exc:
            raise InfraError(f"the warm sandbox did not take its request: {exc}") from exc
        finally:
            for fd in (stdin, out_w, err_w, st_w):
                os.close(fd)
        t0 = time.monotonic()
        watch = Watch(
            stdout_cap=limits.stdout_bytes,
            stderr_cap=limits.stderr_bytes,
            deadline=t0 + limits.wall_time_s,
            on_output=on_output,
        )
        status = bytearray()
        done: int | None = None
        frozen = False
        open_fds = {out_r: STDOUT, err_r: STDERR, st_r: "status"}

        def note_status(_fd: int, _kind: str, chunk: bytes) -> None:
            status.extend(chunk)

        def ended() -> bool:
            """pid 1's early report that the program ended: freeze the run there."""
            nonlocal done, frozen
            assert quiesce is not None
            if done is None:
                done = parse_done(bytes(status))
                if done is not None:
                    # Everything the program wrote before it ended is in the pipes already.
                    frozen = quiesce()
                    if not frozen:
                        child.send(signal.SIGTERM)
            return frozen

        pump(
            watch,
            open_fds,
            stop_fd=stop_fd,
            first=st_r,
            other=note_status,
            after=ended if quiesce is not None else None,
        )
        if frozen:
            for fd, kind in open_fds.items():
                if kind != "status":
                    _drain(fd, kind, watch)
        stopped_by = watch.stopped_by
        if stopped_by:
            # SIGTERM from outside the namespace asks pid 1 to kill everything else in it; the
            # workspace stays for the exports, as in a cold run.
            child.send(signal.SIGTERM)
        # The status pipe closes once pid 1 reported; bounded, in case it died instead.
        end = time.monotonic() + 10
        while st_r in open_fds and not frozen and time.monotonic() < end:
            if select.select([st_r], [], [], max(end - time.monotonic(), 0))[0]:
                chunk = os.read(st_r, READ_CHUNK)
                if not chunk:
                    break
                status += chunk
        wall_ms = (time.monotonic() - t0) * 1000
        started, wait_status, cpu_ms, maxrss = parse_status(bytes(status))
        if done is not None and (frozen or wait_status is not None):
            # The program's own end (pid 1 then only saw the kill of the frozen or stopped
            # run); CPU time and peak memory come from the cgroup.
            wait_status = done << 8
        artifacts: tuple[Any, ...] = ()
        rejected: tuple[Any, ...] = ()
        code: int | None
        sig: int | None
        if wait_status is None:
            # pid 1 died without a report (killed from outside): nothing left to export.
            child.send(signal.SIGKILL)
            code, sig = None, signal.SIGKILL
        else:
            code, sig = (
                (None, os.WTERMSIG(wait_status))
                if os.WIFSIGNALED(wait_status)
                else (os.WEXITSTATUS(wait_status), None)
            )
            if started:
                artifacts, rejected = collect(Path(f"/proc/{child.init_pid}/root{SANDBOX_WORKDIR}"))
        return (
            Launched(
                started=started,
                exit_code=code,
                signal=sig,
                stdout=bytes(watch.data[STDOUT]),
                stderr=bytes(watch.data[STDERR]),
                stdout_truncated=watch.truncated[STDOUT],
                stderr_truncated=watch.truncated[STDERR],
                stopped_by=stopped_by,
                wall_ms=wall_ms,
                cpu_ms_rusage=cpu_ms,
                maxrss_bytes_rusage=maxrss,
            ),
            artifacts,
            rejected,
        )
    finally:
        for fd in ours:
            with contextlib.suppress(OSError):
                os.close(fd)


def _drain(fd: int, kind: str, watch: Watch) -> None:
    """What a frozen run left in a pipe: read without waiting (its writers are stopped, so the
    pipe never reaches end-of-file), until it is empty or the stream went over its cap."""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk or watch.output(kind, chunk):
            return
