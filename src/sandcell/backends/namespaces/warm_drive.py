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
The 3 ms target is out of reach with this design in Python: the floor is the program's exit
(page tables of the template image) plus two cross-process wake-ups plus the record.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from pathlib import Path
from typing import Any

from sandcell.backends.base import Collector
from sandcell.backends.namespaces.bwrap import SANDBOX_WORKDIR
from sandcell.backends.namespaces.launcher import Launched, _stdin_fd
from sandcell.backends.namespaces.template import WarmChild, send_message
from sandcell.errors import InfraError
from sandcell.spec import RunRequest

__all__ = ["drive", "parse_status"]

_READ_CHUNK = 65536


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


def drive(
    child: WarmChild,
    doc: dict[str, Any],
    request: RunRequest,
    trees: list[int],
    collect: Collector,
    *,
    stop_fd: int,
) -> tuple[Launched, tuple[Any, ...], tuple[Any, ...]]:
    """Send the request, pump the output under the limits, read the status, export."""
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
        deadline = t0 + limits.wall_time_s
        out, err, status = bytearray(), bytearray(), bytearray()
        out_trunc = err_trunc = False
        stopped_by: str | None = None
        open_fds = {out_r: "stdout", err_r: "stderr", st_r: "status"}
        while open_fds and not stopped_by:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped_by = "wall_time"
                break
            ready, _, _ = select.select([*open_fds, stop_fd], [], [], remaining)
            if stop_fd in ready:
                stopped_by = "cancelled"
                break
            ready.sort(key=lambda fd: fd != st_r)
            for fd in ready:
                chunk = os.read(fd, _READ_CHUNK)
                kind = open_fds[fd]
                if not chunk:
                    del open_fds[fd]
                elif kind == "status":
                    status += chunk
                elif kind == "stdout":
                    room = limits.stdout_bytes - len(out)
                    out += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        out_trunc, stopped_by = True, stopped_by or "stdout"
                else:
                    room = limits.stderr_bytes - len(err)
                    err += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        err_trunc, stopped_by = True, stopped_by or "stderr"
        if stopped_by:
            # SIGTERM from outside the namespace asks pid 1 to kill everything else in it; the
            # workspace stays for the exports, as in a cold run.
            child.send(signal.SIGTERM)
        # The status pipe closes once pid 1 reported; bounded, in case it died instead.
        end = time.monotonic() + 10
        while st_r in open_fds and time.monotonic() < end:
            if select.select([st_r], [], [], max(end - time.monotonic(), 0))[0]:
                chunk = os.read(st_r, _READ_CHUNK)
                if not chunk:
                    break
                status += chunk
        wall_ms = (time.monotonic() - t0) * 1000
        started, wait_status, cpu_ms, maxrss = parse_status(bytes(status))
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
                stdout=bytes(out),
                stderr=bytes(err),
                stdout_truncated=out_trunc,
                stderr_truncated=err_trunc,
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
