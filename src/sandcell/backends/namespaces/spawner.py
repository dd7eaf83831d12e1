"""A process that waits inside a cold run's cgroup, made ahead, to become that run's bubblewrap.

Moving a process into a cgroup (a ``cgroup.procs`` write) waits for the kernel's grace period
whenever no move happened recently: 4-10 ms on the development host, the largest single wait
on a cold run's path once its cgroup is made ahead (``spare_cgroup.py``). A :class:`Spawner`
takes that wait off the path: it is started and moved into the spare cgroup while the host is
idle, with every descriptor of the launch (:class:`~sandcell.backends.namespaces.launcher.Pipes`,
its standard input, output and error) already in place, and blocks reading a "go" pipe. When
the run comes, the host writes bwrap's options into the arguments memfd and the program's
input into the stdin memfd, then one byte into the go pipe; the spawner ``exec``\\ s bwrap
(``--args``), which is therefore born in the run's cgroup, and so is every process of the
sandbox: nothing is attached at run time.

The spawner is ``/bin/bash`` running one ``read`` and one ``exec`` (a shell starts in a
millisecond or two, a Python interpreter in ten), with an empty environment and ``/`` as its
working directory, and it passes bwrap exactly the descriptors, name and arguments that
:func:`~sandcell.backends.namespaces.launcher.spawn` would (bwrap clears the sandbox's
environment itself). It is its own session leader (the launcher kills bwrap's process group on a
stop). If the host goes away the go pipe reads end-of-file and the spawner exits without
starting anything; if it dies while waiting, the run that takes its cgroup attaches its sandbox
the ordinary way.

Inside the cgroup, bwrap's own process counts against the run's ``pids.max``, so a group with a
spawner gets one process more than the run's limit (:data:`EXTRA_PIDS`): the sandbox's
processes keep exactly their limit. bwrap's few pages after the ``exec`` are charged to the
run's memory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from sandcell.backends.host import cgroups
from sandcell.backends.namespaces.launcher import Pipes
from sandcell.errors import InfraError

__all__ = ["EXTRA_PIDS", "Spawner", "in_cgroup", "spawner_in"]

EXTRA_PIDS = 1
"""Processes a spawner's group holds beyond the sandbox's: bwrap itself."""

_SHELL = "/bin/bash"
"""bash, not dash: dash's redirections take only one-digit descriptors."""
# Exit status when the go pipe closes without a byte: nothing was started.
_NOT_STARTED = 125


class Spawner:
    """One waiting spawner and the launch descriptors it holds (see module)."""

    def __init__(
        self,
        bwrap: str,
        seccomp_program: bytes | None,
        command: list[str],
        *,
        stdin_fd: int | None = None,
    ) -> None:
        """Start the spawner for the bwrap at ``bwrap`` and the sandbox ``command`` (bwrap reads
        only options from its arguments memfd: the command is on its line, so it is fixed now).
        ``stdin_fd``: the sandbox's standard input, fixed now (a session's kernel socket); by
        default a memfd that :meth:`start` fills. Raises InfraError if it cannot start."""
        self.pipes = Pipes(seccomp_program)
        self._fixed_stdin = stdin_fd is not None
        self._stdin = (
            -1 if stdin_fd is not None else os.memfd_create("sandcell-stdin", os.MFD_CLOEXEC)
        )
        go_r, self._go_w = os.pipe2(os.O_CLOEXEC)
        args = self.pipes.fds().args
        assert args is not None
        # The go descriptor is closed as bwrap starts; bwrap is named by its name only, as
        # the launcher's own start names it.
        script = (
            f"read -r _ <&{go_r} || exit {_NOT_STARTED}; "
            f'exec -a bwrap "$0" --args {args} -- "$@" {go_r}<&-'
        )
        self.bwrap = bwrap
        self.command = list(command)
        try:
            self.proc = subprocess.Popen(
                [_SHELL, "-c", script, bwrap, *command],
                executable=_SHELL,
                stdin=stdin_fd if stdin_fd is not None else self._stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(*self.pipes.fds().passed(), go_r),
                close_fds=True,
                env={},
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            self._close_host_fds()
            raise InfraError(f"could not start the spawner ({_SHELL}): {exc}") from exc
        finally:
            os.close(go_r)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def host_fds(self) -> frozenset[int]:
        """The descriptors this process holds for the spawner while it waits."""
        streams = (self.proc.stdout, self.proc.stderr)
        held = {*self.pipes.open_fds(), self._stdin, self._go_w}
        held |= {s.fileno() for s in streams if s is not None and not s.closed}
        return frozenset(fd for fd in held if fd >= 0)

    def argv(self) -> list[str]:
        """The command line the spawner will run: what
        :func:`~sandcell.backends.namespaces.bwrap.args_via_fd` gives for its bwrap, arguments
        memfd and command."""
        return [self.bwrap, "--args", str(self.pipes.fds().args), "--", *self.command]

    def start(self, argv: list[str], stdin: bytes) -> subprocess.Popen[bytes]:
        """Let the spawner become bwrap with ``argv`` (its options already in the arguments
        memfd) and ``stdin`` as the program's input. Returns its process, now bwrap's. Raises
        InfraError, starting nothing, when ``argv`` is not :meth:`argv`."""
        if argv != self.argv():
            raise InfraError(f"the spawner was made for {self.argv()!r}, not {argv!r}")
        if self._fixed_stdin:
            if stdin:
                raise InfraError("this spawner's standard input was fixed when it was made")
        else:
            view = memoryview(stdin)
            while view:
                n = os.write(self._stdin, view)
                view = view[n:]
            os.lseek(self._stdin, 0, os.SEEK_SET)  # the spawner's fd 0 shares this offset
            os.close(self._stdin)
            self._stdin = -1
        try:
            os.write(self._go_w, b"\n")
        except OSError as exc:  # it died since it was taken: nothing started
            raise InfraError(f"the spawner of this run has gone ({exc})") from exc
        os.close(self._go_w)
        self._go_w = -1
        self.pipes.close_child_ends()
        return self.proc

    def discard(self) -> None:
        """End a spawner that was not started: it reads end-of-file and exits; reaped here."""
        self._close_host_fds()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.pipes.close_all()

    def _close_host_fds(self) -> None:
        for fd in (self._stdin, self._go_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stdin = self._go_w = -1


def in_cgroup(pid: int, dirs: dict[str, Path]) -> bool:
    """Whether process ``pid`` is in the group whose directories are ``dirs`` (controller →
    directory) in every controller, read from ``/proc/PID/cgroup``."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    paths: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for ctrl in controllers.split(",") if controllers else ["unified"]:
            paths[ctrl] = path
    for ctrl, d in dirs.items():
        own = paths.get(ctrl)
        if own is None or own in ("", "/") or not str(d).endswith(own):
            return False
    return True


def spawner_in(
    group: cgroups.RunCgroup,
    *,
    bwrap: str,
    seccomp_program: bytes | None,
    command: list[str],
    max_pids: int,
    stdin_fd: int | None = None,
) -> Spawner | None:
    """A spawner started now and moved into the run's own ``group`` (limited to ``max_pids``
    sandbox processes), whose ``pids.max`` then makes room for bwrap (:data:`EXTRA_PIDS`); None
    when it could not be (the run then attaches its sandbox as before).

    For a cold run that found no spare: bwrap born outside the group left a window, between its
    clone and the attach, in which a supervisor SIGKILLed took the outer bwrap with it
    (``--die-with-parent``) and left the inner one, pid 1 of the sandbox, waiting forever in no
    cgroup for a parent that was gone. Born in the group, the whole sandbox is where the sweep
    of a dead supervisor's groups kills it. ``stdin_fd`` as for :class:`Spawner`."""
    try:
        spawner = Spawner(bwrap, seccomp_program, command, stdin_fd=stdin_fd)
    except InfraError:
        return None
    try:
        group.attach(spawner.pid)
        pids = group.dirs["unified" if group.host.version == 2 else "pids"] / "pids.max"
        pids.write_text(str(max_pids + EXTRA_PIDS))
    except (OSError, KeyError):
        spawner.discard()
        return None
    return spawner
