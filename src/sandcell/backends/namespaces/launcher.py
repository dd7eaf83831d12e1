"""The launcher: start bubblewrap, hold the sandbox until its limits are on, then supervise it.

The one place where a sandbox process is started. The sequence is the security argument:

1. spawn bwrap with an empty environment and only the descriptors it needs (``close_fds``);
2. bwrap builds the namespaces and blocks (``--block-fd``) before starting anything untrusted;
3. read the sandbox init's pid (``--info-fd``), move it into the run's cgroup and set its rlimits,
   so every process of the run inherits both; (a spawner that waits in the run's cgroup,
   checked there and given the rlimits before it becomes bwrap, needs neither: bwrap then runs
   without ``--block-fd`` and the sandbox does not wait for this process: ``held=False``)
4. unblock; the boot step inside closes every inherited descriptor but 0-2, applies Landlock and
   reports on the status pipe that the program is about to start;
5. pump stdout and stderr with independent caps until exit, the wall limit, a cap or a
   cancellation (a byte on the run's :class:`StopPipe`), in the supervise loop every rung shares
   (``host/supervise.py``); then the sandbox init is SIGKILLed, which tears down its pid
   namespace and with it every process of the run, however it forked.

Sessions start their long-lived sandbox with the same pieces (:func:`spawn`,
:func:`read_sandbox_pid`, :func:`kill_sandbox`, :func:`reap`) but supervise it themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from sandcell.backends.host.process import (
    BOOT_FAILED_STATUS,
    HelperChannel,
    Launched,
    StopPipe,
    decode_wait,
    kill_sandbox,
    reap,
    reported_status,
)
from sandcell.backends.host.supervise import READ_CHUNK, STDERR, STDOUT, Watch, pump
from sandcell.errors import InfraError

if TYPE_CHECKING:
    from sandcell.backends.base import OutputSink


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
    held: bool = True,
) -> Launched:
    """Run bwrap to completion under the limits. Raises InfraError if it could not be started.

    ``after_exit(pid)`` runs once no sandboxed process is alive, while the workspace still exists
    (with a workspace ``helper``, before the helper, whose pid it gets, is released). ``stop``:
    once set, the run is killed as at the wall limit and ends ``stopped_by="cancelled"``.
    ``start(argv, stdin)``: starts bwrap in place of :func:`spawn` (a spawner made ahead,
    ``spawner.py``, holding ``pipes``). ``on_output`` is told what is kept of each stream as it
    is read. ``held=False``: bwrap was given no ``--block-fd`` (its limits were on before it
    started); ``on_sandbox_pid`` is still told the init's pid, once the sandbox runs.
    """
    started_at = time.monotonic()
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
    if held:
        t0 = time.monotonic()
        os.write(pipes.block_w, b"1")
    else:
        t0 = started_at  # it has been running since the start
    pipes.close(pipes.block_w)

    watch = Watch(
        stdout_cap=stdout_cap,
        stderr_cap=stderr_cap,
        deadline=t0 + wall_time_s,
        on_output=on_output,
    )
    status_bytes = bytearray()

    def note_status(_fd: int, _kind: str, chunk: bytes) -> None:
        status_bytes.extend(chunk)

    open_fds = {out_fd: STDOUT, err_fd: STDERR, pipes.status_r: "status"}
    # The status pipe first: its "started" byte was written before the program could print, and
    # a cap hit in the same batch must not hide it. The stop pipe is not one of open_fds: the
    # run ends when its own pipes close, whatever the stop pipe holds.
    pump(
        watch,
        open_fds,
        stop_fd=stop.r if stop is not None else None,
        first=pipes.status_r,
        other=note_status,
    )
    stopped_by = watch.stopped_by
    if stopped_by and pipes.status_r in open_fds:
        # Stopped early: whatever the boot already reported is still in the pipe.
        while select.select([pipes.status_r], [], [], 0)[0]:
            chunk = os.read(pipes.status_r, READ_CHUNK)
            if not chunk:
                break
            status_bytes += chunk
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
    reported = reported_status(bytes(status_bytes))
    code, sig = _decode(status) if reported is None else decode_wait(reported)
    return Launched(
        # Only the "1" the boot writes right before the program counts as started; a wait status
        # alone means it failed before that.
        started=status_bytes.startswith(b"1"),
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
    )


def _rusage_totals(rusage: resource.struct_rusage | None) -> tuple[float, int]:
    if rusage is None:
        return 0.0, 0
    return (rusage.ru_utime + rusage.ru_stime) * 1000, rusage.ru_maxrss * 1024


def _decode(status: int) -> tuple[int | None, int | None]:
    """Fallback when the boot could not report (it was killed): bwrap's own exit status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    # bwrap reports a program killed by signal N as exit status 128+N, as shells do.
    if 128 < code <= 128 + 64 and code != BOOT_FAILED_STATUS:
        return None, code - 128
    return code, None


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
