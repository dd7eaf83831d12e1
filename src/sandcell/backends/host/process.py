"""Process plumbing every rung shares: what a launch observed, its stop button, the workspace
helper's channel, wait statuses, killing and reaping a sandbox's first process.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import subprocess
import time
from dataclasses import dataclass

from sandcell.errors import InfraError

# The exit status the boot uses when it could not apply an isolation layer it was asked for.
BOOT_FAILED_STATUS = 125


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    """What the launcher observed."""

    started: bool
    """True once the boot step reported that the program is starting."""
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    stopped_by: str | None
    """``"wall_time"``, ``"stdout"``, ``"stderr"`` or ``"cancelled"`` when the launcher killed
    the run."""
    wall_ms: float
    cpu_ms_rusage: float
    maxrss_bytes_rusage: int


class StopPipe:
    """A run's stop button: :meth:`set` from any thread makes :func:`launch` kill the run.

    A pipe rather than an Event, so the launcher's one ``select`` wakes on it. Close it only once
    nothing can call :meth:`set` any more: a write after the close could reach a reused
    descriptor.
    """

    def __init__(self) -> None:
        self.r, self.w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def set(self) -> None:
        # A full pipe already holds a stop request.
        with contextlib.suppress(BlockingIOError):
            os.write(self.w, b"x")

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


class HelperChannel:
    """The pipes to the workspace helper of an ordinary user (see ``_mount_helper``)."""

    def __init__(self) -> None:
        self.result_r, self.result_w = os.pipe2(os.O_CLOEXEC)
        self.hold_r, self.hold_w = os.pipe2(os.O_CLOEXEC)

    def child_fds(self) -> tuple[int, int]:
        return self.result_w, self.hold_r

    def close_child_ends(self) -> None:
        for fd in (self.result_w, self.hold_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def read_result(self, deadline: float) -> tuple[int, float, int]:
        """bwrap's wait status, CPU ms and max RSS, as the helper measured them."""
        buf = b""
        while not buf.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.result_r], [], [], max(remaining, 0))
            if not ready:
                raise InfraError("the workspace helper did not report bubblewrap's exit status")
            chunk = os.read(self.result_r, 256)
            if not chunk:
                raise InfraError("the workspace helper exited without reporting a status")
            buf += chunk
        status, cpu, rss = buf.split()
        return int(status), float(cpu), int(rss)

    def release(self) -> None:
        for fd in (self.hold_w, self.result_r):
            with contextlib.suppress(OSError):
                os.close(fd)


def reported_status(data: bytes) -> int | None:
    """The program's wait status as the boot's supervising process reported it, if it did."""
    _, marker, rest = data.partition(b"W")
    if not marker or not rest.endswith(b"\n"):
        return None
    try:
        return int(rest)
    except ValueError:
        return None


def decode_wait(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def kill_sandbox(sandbox_pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the sandbox init, which kills every process of its pid namespace, and the process
    group of ``proc`` (bwrap) when given. Call it before ``proc`` is reaped: once the sandbox is
    gone its pids may be reused."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(sandbox_pid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def reap(proc: subprocess.Popen[bytes]) -> tuple[int, resource.struct_rusage | None]:
    """Wait for ``proc`` (killing it after 10 s), close its pipes; its wait status and usage."""
    deadline = time.monotonic() + 10
    while True:
        try:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by someone else (a process that ignores SIGCHLD, a wait for any child):
            # its status is lost, but it is gone, and Popen must not think it still runs (its
            # finaliser would warn, at some later moment, that it does).
            proc.returncode = 0
            _drain(proc)
            return 0, None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            _drain(proc)
            return status, rusage
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            deadline = time.monotonic() + 10
        time.sleep(0.001)


def _drain(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
