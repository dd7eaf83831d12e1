"""The launcher: start bubblewrap, hold the sandbox until its limits are on, then supervise it.

The one place where a sandbox process is started. The sequence is the security argument:

1. spawn bwrap with an empty environment and only the descriptors it needs (``close_fds``);
2. bwrap builds the namespaces and blocks (``--block-fd``) before starting anything untrusted;
3. read the sandbox init's pid (``--info-fd``), move it into the run's cgroup and set its rlimits,
   so every process of the run inherits both;
4. unblock; the boot step inside closes every inherited descriptor but 0-2, applies Landlock and
   reports on the status pipe that the program is about to start;
5. pump stdout and stderr with independent caps until exit, the wall limit, a cap or a
   cancellation (a byte on the run's :class:`StopPipe`); then the sandbox init is SIGKILLed, which
   tears down its pid namespace and with it every process of the run, however it forked.

Sessions start their long-lived sandbox with the same pieces (:func:`spawn`,
:func:`read_sandbox_pid`, :func:`kill_sandbox`, :func:`reap`) but supervise it themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from sandcell.errors import InfraError

if TYPE_CHECKING:
    from sandcell.backends.base import OutputSink

# The exit status the boot uses when it could not apply an isolation layer it was asked for.
BOOT_FAILED_STATUS = 125
_READ_CHUNK = 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchFds:
    """Descriptors handed to bwrap; the numbers appear in its argument list."""

    info_w: int
    block_r: int
    status_w: int
    seccomp: int | None
    args: int | None = None
    """A memfd for bwrap's arguments (``--args FD``): on its command line they would be readable
    inside the sandbox as ``/proc/1/cmdline``, host paths and all."""

    def passed(self) -> tuple[int, ...]:
        fds = [self.info_w, self.block_r, self.status_w]
        if self.seccomp is not None:
            fds.append(self.seccomp)
        if self.args is not None:
            fds.append(self.args)
        return tuple(fds)


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


class Pipes:
    """The pipes of one launch; closes whatever is still open."""

    def __init__(self, seccomp_program: bytes | None) -> None:
        self._fds: list[int] = []
        self.info_r, self.info_w = self._pipe()
        self.block_r, self.block_w = self._pipe()
        self.status_r, self.status_w = self._pipe()
        self.seccomp: int | None = None
        if seccomp_program is not None:
            # A memfd rather than a pipe: the program may exceed a pipe's buffer, and bwrap reads it
            # only after we would be blocked writing.
            fd = os.memfd_create("sandcell-seccomp", os.MFD_CLOEXEC)
            self._fds.append(fd)
            os.write(fd, seccomp_program)
            os.lseek(fd, 0, os.SEEK_SET)
            self.seccomp = fd
        self.args = os.memfd_create("sandcell-args", os.MFD_CLOEXEC)
        self._fds.append(self.args)

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self._fds += [r, w]
        return r, w

    def fds(self) -> LaunchFds:
        return LaunchFds(
            info_w=self.info_w,
            block_r=self.block_r,
            status_w=self.status_w,
            seccomp=self.seccomp,
            args=self.args,
        )

    def open_fds(self) -> tuple[int, ...]:
        """The descriptors still open here."""
        return tuple(self._fds)

    def close(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.remove(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_child_ends(self) -> None:
        for fd in (self.info_w, self.block_r, self.status_w, self.seccomp, self.args):
            if fd is not None:
                self.close(fd)

    def close_all(self) -> None:
        for fd in list(self._fds):
            self.close(fd)


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


def _stdin_fd(data: bytes) -> int:
    """A descriptor that reads ``data`` then EOF, without a writer thread."""
    fd = os.memfd_create("sandcell-stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def spawn(
    argv: Sequence[str], *, pipes: Pipes, stdin: int, helper: HelperChannel | None
) -> subprocess.Popen[bytes]:
    """Start bwrap (or the workspace helper running it) with only the descriptors it needs, then
    close this process's copies of the child's ends. Raises InfraError if it cannot start."""
    try:
        proc = subprocess.Popen(
            # Started by its name only: the path (a wheel's bwrap lives in the venv) would be the
            # sandbox's /proc/1/cmdline.
            [os.path.basename(argv[0]), *argv[1:]],
            executable=argv[0],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pipes.fds().passed() + (helper.child_fds() if helper else ()),
            close_fds=True,
            # bwrap's own environment would be readable as /proc/1/environ inside the sandbox.
            env={},
            start_new_session=True,
        )
    except OSError as exc:
        raise InfraError(f"could not start bubblewrap ({argv[0]}): {exc}") from exc
    pipes.close_child_ends()
    if helper is not None:
        helper.close_child_ends()
    return proc


def read_sandbox_pid(fd: int, proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The sandbox init's pid from bwrap's ``--info-fd``, or None if bwrap died first."""
    buf = b""
    while b"}" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
        if not ready:
            if proc.poll() is not None:
                return None
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf += chunk
    try:
        return int(json.loads(buf[: buf.index(b"}") + 1])["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def launch(
    argv: Sequence[str],
    *,
    pipes: Pipes,
    stdin: bytes,
    wall_time_s: float,
    stdout_cap: int,
    stderr_cap: int,
    on_sandbox_pid: Callable[[int], None],
    on_kill: Callable[[], None],
    after_exit: Callable[[int], None],
    helper: HelperChannel | None = None,
    stop: StopPipe | None = None,
    setup_timeout_s: float = 30.0,
    start: Callable[[list[str], bytes], subprocess.Popen[bytes]] | None = None,
    on_output: OutputSink | None = None,
) -> Launched:
    """Run bwrap to completion under the limits. Raises InfraError if it could not be started.

    ``after_exit(pid)`` runs once no sandboxed process is alive, while the workspace still exists
    (with a workspace ``helper``, before the helper, whose pid it gets, is released). ``stop``:
    once set, the run is killed as at the wall limit and ends ``stopped_by="cancelled"``.
    ``start(argv, stdin)``: starts bwrap in place of :func:`spawn` (a spawner made ahead,
    ``spawner.py``, holding ``pipes``). ``on_output`` is told what is kept of each stream as it
    is read.
    """
    if start is not None:
        proc = start(list(argv), stdin)
    else:
        stdin_fd = _stdin_fd(stdin)
        try:
            proc = spawn(argv, pipes=pipes, stdin=stdin_fd, helper=helper)
        finally:
            os.close(stdin_fd)
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()

    sandbox_pid = read_sandbox_pid(pipes.info_r, proc, time.monotonic() + setup_timeout_s)
    if sandbox_pid is None:
        if helper is not None:
            helper.release()
        _finish_failed(proc, "bubblewrap did not start the sandbox")
    try:
        on_sandbox_pid(sandbox_pid)
    except BaseException:
        kill_sandbox(sandbox_pid, proc)
        reap(proc)
        raise
    t0 = time.monotonic()
    os.write(pipes.block_w, b"1")
    pipes.close(pipes.block_w)

    deadline = t0 + wall_time_s
    out, err = bytearray(), bytearray()
    out_trunc = err_trunc = False
    started = False
    status_bytes = b""
    stopped_by: str | None = None
    open_fds = {out_fd: "stdout", err_fd: "stderr", pipes.status_r: "status"}
    # Not one of open_fds: the run ends when its own pipes close, whatever the stop pipe holds.
    stop_fds = [stop.r] if stop is not None else []
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            stopped_by = "wall_time"
            break
        ready, _, _ = select.select([*open_fds, *stop_fds], [], [], remaining)
        if stop_fds and stop_fds[0] in ready:
            stopped_by = "cancelled"
            break
        # The status pipe first: its "started" byte was written before the program could
        # print, and a cap hit in the same batch must not hide it.
        ready.sort(key=lambda fd: fd != pipes.status_r)
        for fd in ready:
            chunk = os.read(fd, _READ_CHUNK)
            kind = open_fds[fd]
            if not chunk:
                del open_fds[fd]
                continue
            if kind == "status":
                status_bytes += chunk
                # Only the "1" the boot writes right before the program counts as started; a
                # wait status alone means it failed before that.
                started = status_bytes.startswith(b"1")
            elif kind == "stdout":
                room = stdout_cap - len(out)
                kept = chunk[: max(room, 0)]
                out += kept
                if on_output is not None and kept:
                    on_output("stdout", kept)
                if len(chunk) > room:
                    out_trunc = True
                    stopped_by = stopped_by or "stdout"
            else:
                room = stderr_cap - len(err)
                kept = chunk[: max(room, 0)]
                err += kept
                if on_output is not None and kept:
                    on_output("stderr", kept)
                if len(chunk) > room:
                    err_trunc = True
                    stopped_by = stopped_by or "stderr"
        if stopped_by:
            break
    if stopped_by and pipes.status_r in open_fds:
        # Stopped early: whatever the boot already reported is still in the pipe.
        while select.select([pipes.status_r], [], [], 0)[0]:
            chunk = os.read(pipes.status_r, _READ_CHUNK)
            if not chunk:
                break
            status_bytes += chunk
            started = status_bytes.startswith(b"1")
    if stopped_by:
        on_kill()
        # With a workspace helper, ``proc`` is the helper and its process group holds it: killing
        # that group would lose bwrap's status (and the workspace to export from). Killing the
        # sandbox init is enough: bwrap then exits and the helper reports its status.
        kill_sandbox(sandbox_pid, proc if helper is None else None)
    if helper is None:
        # The init of the sandbox is gone once its pipes are closed; reap bwrap (bounded).
        status, rusage = reap(proc)
        wall_ms = (time.monotonic() - t0) * 1000
        cpu_ms, maxrss = _rusage_totals(rusage)
        pipes.close_all()
        after_exit(proc.pid)
    else:
        status, cpu_ms, maxrss = helper.read_result(time.monotonic() + 10)
        wall_ms = (time.monotonic() - t0) * 1000
        pipes.close_all()
        try:
            after_exit(proc.pid)
        finally:
            helper.release()
            reap(proc)
    reported = reported_status(status_bytes)
    code, sig = _decode(status) if reported is None else decode_wait(reported)
    return Launched(
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
    )


def _rusage_totals(rusage: resource.struct_rusage | None) -> tuple[float, int]:
    if rusage is None:
        return 0.0, 0
    return (rusage.ru_utime + rusage.ru_stime) * 1000, rusage.ru_maxrss * 1024


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


def _decode(status: int) -> tuple[int | None, int | None]:
    """Fallback when the boot could not report (it was killed): bwrap's own exit status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    # bwrap reports a program killed by signal N as exit status 128+N, as shells do.
    if 128 < code <= 128 + 64 and code != BOOT_FAILED_STATUS:
        return None, code - 128
    return code, None


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


def _finish_failed(proc: subprocess.Popen[bytes], what: str) -> NoReturn:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    assert proc.stderr is not None
    try:
        err = proc.stderr.read(65536)
    except (OSError, ValueError):
        err = b""
    reap(proc)
    raise InfraError(f"{what}: {err.decode(errors='replace').strip() or 'no error output'}")


__all__ = [
    "BOOT_FAILED_STATUS",
    "HelperChannel",
    "LaunchFds",
    "Launched",
    "Pipes",
    "StopPipe",
    "decode_wait",
    "kill_sandbox",
    "launch",
    "read_sandbox_pid",
    "reap",
    "reported_status",
    "spawn",
]
