"""The sandbox of one session: the namespaces backend's layers, kept alive across cells.

Built like a cold run, by :class:`~sandcell.backends.namespaces.prepared.PreparedSandbox`:
layers decided and failed closed, a run directory with a size-capped workspace tmpfs (or the
rootless workspace helper), the session's cgroup, the bwrap argument list with seccomp, the
sandbox init moved into the cgroup and given its rlimits before it starts anything, then the
boot applying Landlock and starting the kernel (``_kernel.py``, or ``_kernel.mjs`` under Node for a
JavaScript or TypeScript session: ``backends/cell/kernel.py``) instead of a program. A session
whose profile reaches outside gets its ways out (``sockets``) for its whole life, shown as for a
cold run (``backends/namespaces/outside.py``): the boot starts the egress bridge before the
kernel, and the kernel gets the tool client's directory on its path.

The kernel's standard input is one end of a socket pair: the cell channel. Its stdout and stderr
are pipes the host reads while a cell runs; what arrives between a cell's start and its reply is
that cell's output. :meth:`SessionSandbox.run_cell` enforces the cell's wall time with SIGINT to
the kernel (the cell ends, the state stays) and, when the kernel does not return within
:data:`INTERRUPT_GRACE_S`, kills the whole sandbox.

bwrap is started, and waited for, by a keeper thread that lives as long as the session: bwrap's
``--die-with-parent`` is tied to the thread that started it, so a session opened on a short-lived
worker thread would otherwise die with that thread.

Security limitations: the same as the namespaces backend's (a shared kernel). On top of them, the
memory, process and CPU-time limits are the session's, not a cell's: a cell can use up what the
session has left, and RLIMIT_CPU counts the kernel's CPU time over the whole session. Files are
exported while the session is alive, so a process a cell left running can change them during the
export (the export itself still refuses links and special files); export at close for a
quiescent workspace.

A session pauses, snapshots and forks with files only (``session_state.py``: the workspace as a
tar, copied with the session's cgroup frozen where it has a freezer; memory is refused, as no
CRIU here restores the same confinement); a sandbox opened with ``restore`` is a fresh one whose
workspace is filled from the state before its first cell. :meth:`SessionSandbox.metrics` is
``session_metrics.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sandcell.artifacts.store import ArtifactStore
from sandcell.backends import inside
from sandcell.backends.base import Collector, OutputSink
from sandcell.backends.cell import (
    CappedOutput,
    CellRun,
    CellScope,
    Exported,
    kernel_message,
)
from sandcell.backends.cell.channel import MAX_KERNEL_MESSAGE, ChannelError, FrameDecoder, encode
from sandcell.backends.cell.kernel import kernel_command, kernel_file
from sandcell.backends.cell.loop import CellRung, supervise_cell
from sandcell.backends.cell.state import PauseMode, RestorePoint, SandboxMetrics, SavedState
from sandcell.backends.cell.verdict import INTERRUPT_GRACE_S, CellCancel, classify_cell
from sandcell.backends.host import cgroups, landlock, workspace
from sandcell.backends.host.layout import CONTROL_DIR, CONTROL_DISPLAY, SESSION_OUTPUTS_DIR
from sandcell.backends.host.process import HelperChannel, kill_sandbox, reap, reported_status
from sandcell.backends.namespaces import NamespacesBackend, outside, session_state
from sandcell.backends.namespaces.launcher import Pipes, read_sandbox_pid, spawn
from sandcell.backends.namespaces.prepared import PreparedSandbox, boot_command
from sandcell.backends.namespaces.session_metrics import MetricsSampler
from sandcell.backends.namespaces.spawner import Spawner, spawner_in
from sandcell.display import DisplayCollection, read_outputs_below, refused_outputs
from sandcell.errors import InfraError
from sandcell.run_sockets import SandboxSockets
from sandcell.spec import NODE_LANGUAGES, Enforcement, RunRequest, Usage

SETUP_TIMEOUT_S = 60.0

_DISPLAY_SOURCE = inside.DISPLAY_SCRIPT
_READ_CHUNK = 65536
_CELL_DIR = re.compile(r"[0-9]{1,15}")


class SessionSandbox:
    """One live sandbox running a kernel. Not thread-safe: the session serialises its calls."""

    def __init__(
        self,
        backend: NamespacesBackend,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> None:
        self.restore = restore
        """The state :meth:`start` brings back, or None to start empty."""
        self.backend = backend
        self.sockets = sockets
        self.request = request
        self.session_id = session_id
        self.limits = request.effective_limits
        self.layers = backend.decide(request)
        # The session's ways out are bound, in the kernel's environment and plan, and its
        # egress bridge started by the boot before the kernel, as for a cold run.
        self.prepared = PreparedSandbox(
            backend, request, name=session_id, layers=self.layers, sockets=sockets
        )
        self.run_dir = self.prepared.run_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.sandbox_pid: int | None = None
        self.kernel_pid: int | None = None
        self.display = False
        self.ended: str | None = None
        self.exit_status: int | None = None
        self._sock: socket.socket | None = None
        self._status_r: int | None = None
        self._status = b""
        self._decoder = FrameDecoder(max_bytes=MAX_KERNEL_MESSAGE)
        self._messages: list[dict[str, object]] = []
        self._keeper_stop = threading.Event()
        self._keeper_done = threading.Event()
        self._launch_error: BaseException | None = None
        self._cell_seq = 0
        self._torn_down = False
        self._protocol_error: str | None = None
        self._metrics = MetricsSampler(self.limits)

    @property
    def cgroup(self) -> cgroups.RunCgroup | None:
        return self.prepared.cgroup

    @property
    def helper(self) -> HelperChannel | None:
        return self.prepared.helper

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the sandbox and wait for the kernel's hello, then fill its workspace from
        :attr:`restore` when one is given. Cleans up after itself on error."""
        try:
            self._metrics = MetricsSampler(self.limits)
            self._prepare()
            started: queue.Queue[BaseException | None] = queue.Queue()
            # A daemon, so a session left open never holds the interpreter at exit: the
            # sessions module closes live sessions from atexit, and bwrap dies with this thread.
            threading.Thread(
                target=self._keeper,
                args=(started,),
                name=f"sandcell-session-{self.session_id}",
                daemon=True,
            ).start()
            error = started.get()
            if error is not None:
                raise error
            self._await_hello()
            session_state.restore(self)
        except BaseException:
            self.teardown()
            raise

    def _prepare(self) -> None:
        # The session's language picks its kernel: _kernel.py, or _kernel.mjs for JavaScript
        # and TypeScript (which shows a cell's value itself: no display module).
        name, kernel = kernel_file(self.request.language)
        files = {name: kernel}
        if _DISPLAY_SOURCE.is_file():
            if self.request.language not in NODE_LANGUAGES:
                files[CONTROL_DISPLAY] = landlock.boot_bytecode(
                    f"{CONTROL_DIR}/display.py", script=_DISPLAY_SOURCE
                )
            self.display = True
        self.prepared.create(files, freezer=True)

    def _command(self) -> list[str]:
        runtime = self.prepared.runtime
        # The boot execs the kernel: its sys.path additions would not reach it.
        paths = [f"/packages/{pkg.name}" for pkg in self.request.packages]
        paths += outside.python_paths(self.sockets)
        kernel = kernel_command(
            self.request.language,
            runtime,
            self.limits,
            self.request.mode,
            paths=paths,
            display=f"{CONTROL_DIR}/{CONTROL_DISPLAY}" if self.display else None,
        )
        return boot_command(runtime.sandbox_python, "exec", *kernel)

    def _keeper(self, started: queue.Queue[BaseException | None]) -> None:
        try:
            self._launch()
        except BaseException as exc:
            started.put(exc)
            self._keeper_done.set()
            return
        started.put(None)
        # Held until teardown: bwrap (or the workspace helper) dies with this thread.
        self._keeper_stop.wait()
        self._keeper_done.set()

    def _launch(self) -> None:
        host_end, kernel_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = host_end
        kernel_end: socket.socket | None = kernel_sock
        spawner: Spawner | None = None
        pipes: Pipes | None = None
        try:
            spawner = self._spawner(kernel_sock.fileno())
            pipes = spawner.pipes if spawner is not None else Pipes(self.backend.seccomp_program)
            fds = pipes.fds()
            argv = self.prepared.argv(self._command(), fds)
            if spawner is not None:
                self.prepared.born_in_cgroup = True
                self.proc = spawner.start(argv, b"")
                spawner = None  # bwrap now, ended with the session
            else:
                self.proc = spawn(argv, pipes=pipes, stdin=kernel_sock.fileno(), helper=self.helper)
            kernel_sock.close()
            kernel_end = None
            pid = read_sandbox_pid(pipes.info_r, self.proc, time.monotonic() + SETUP_TIMEOUT_S)
            if pid is None:
                raise InfraError(
                    "bubblewrap did not start the session's sandbox: " + self._early_stderr()
                )
            self.sandbox_pid = pid
            self.prepared.on_sandbox_pid(pid)
            os.write(pipes.block_w, b"1")
            # The status pipe stays open for the session: the boot reports the kernel's end there.
            self._status_r = os.dup(pipes.status_r)
        finally:
            if spawner is not None:
                spawner.discard()  # not started: it exits
            if kernel_end is not None:
                kernel_end.close()
            if pipes is not None:
                pipes.close_all()

    def _spawner(self, stdin_fd: int) -> Spawner | None:
        """As root, a spawner waiting in the session's cgroup to become its bwrap (None: bwrap
        is started and its sandbox moved in): a server SIGKILLed while the sandbox starts then
        leaves nothing outside the group the sweep removes (``spawner.spawner_in``)."""
        group = self.prepared.cgroup
        if group is None or self.backend.rootless or self.prepared.layers.use_helper:
            return None
        return spawner_in(
            group,
            bwrap=self.backend.bwrap.path,
            seccomp_program=self.backend.seccomp_program,
            command=self._command(),
            max_pids=self.prepared.limits.max_pids,
            stdin_fd=stdin_fd,
        )

    def _early_stderr(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return "no error output"
        fd = self.proc.stderr.fileno()
        data = b""
        while select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace").strip() or "no error output"

    def _await_hello(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        out, err = CappedOutput(self.limits.stdout_bytes), CappedOutput(self.limits.stderr_bytes)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            msg = self._next_message()
            if msg is not None:
                if msg.get("op") != "hello" or not isinstance(msg.get("pid"), int):
                    raise InfraError(f"the session kernel said {msg!r} instead of hello")
                self.kernel_pid = self._host_pid(int(msg["pid"]))  # type: ignore[call-overload]
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InfraError(f"the session kernel did not start within {SETUP_TIMEOUT_S:g} s")
            if self._pump(out, err, remaining) == "ended":
                raise InfraError(
                    "the session's sandbox ended before its kernel started: "
                    + (err.data.decode(errors="replace").strip() or self._describe_exit())
                )

    def _host_pid(self, ns_pid: int) -> int:
        """The host pid of the kernel, found below the sandbox init by its pid in the sandbox."""
        assert self.sandbox_pid is not None
        todo = [self.sandbox_pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                            return pid
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
        raise InfraError(f"could not find the session kernel (pid {ns_pid} in its sandbox)")

    # -- the channel -------------------------------------------------------------------------

    def _next_message(self) -> dict[str, object] | None:
        if self._messages:
            return self._messages.pop(0)
        return None

    def _pump(self, out: CappedOutput, err: CappedOutput, timeout_s: float) -> str | None:
        """Read whatever is ready for up to ``timeout_s``. Returns ``"ended"`` once the kernel
        exited, ``"stdout"``/``"stderr"`` when a cap was passed, else None."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None and self._sock is not None
        out_fd, err_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        watch = [out_fd, err_fd, self._sock.fileno()]
        if self._status_r is not None:
            watch.append(self._status_r)
        ready, _, _ = select.select(watch, [], [], max(timeout_s, 0))
        capped: str | None = None
        for fd in ready:
            if fd == self._sock.fileno():
                try:
                    chunk = self._sock.recv(_READ_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    return "ended" if self._kernel_gone(wait_s=2.0) else None
                self._decoder.feed(chunk)
                try:
                    self._messages += list(self._decoder.messages())
                except ChannelError as exc:
                    self._protocol_error = str(exc)
                    return "ended"
                continue
            chunk = os.read(fd, _READ_CHUNK)
            if fd == self._status_r:
                if not chunk:
                    os.close(self._status_r)
                    self._status_r = None
                    return "ended"
                self._status += chunk
                if self._reported_status() is not None:
                    return "ended"
            elif fd == out_fd and chunk and out.add(chunk):
                capped = capped or "stdout"
            elif fd == err_fd and chunk and err.add(chunk):
                capped = capped or "stderr"
        return capped

    def _kernel_gone(self, *, wait_s: float) -> bool:
        """After the channel closed: wait briefly for the boot's report of the kernel's end."""
        deadline = time.monotonic() + wait_s
        while self._status_r is not None and self._reported_status() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._status_r], [], [], remaining)[0]:
                break
            chunk = os.read(self._status_r, _READ_CHUNK)
            if not chunk:
                break
            self._status += chunk
        return True

    def _reported_status(self) -> int | None:
        return reported_status(self._status)

    def _describe_exit(self) -> str:
        status = self._reported_status()
        if status is None:
            return "it exited without reporting a status"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return f"killed by signal {sig} ({signal.Signals(sig).name})"
        return f"exited with status {os.WEXITSTATUS(status)}"

    # -- one cell ----------------------------------------------------------------------------

    def run_cell(
        self,
        code: str,
        *,
        timeout_s: float,
        hard_deadline: float | None,
        cancel: CellCancel | None = None,
        on_output: OutputSink | None = None,
        scope: CellScope | None = None,
    ) -> CellRun:
        """Run one cell; ``hard_deadline`` (monotonic) is the session's end of life;
        ``on_output`` is told the cell's output as it is read."""
        if self.ended is not None:
            raise InfraError(f"the session's sandbox has ended: {self.ended}")
        self._cell_seq += 1
        out = CappedOutput(self.limits.stdout_bytes, stream="stdout", on_output=on_output)
        err = CappedOutput(self.limits.stderr_bytes, stream="stderr", on_output=on_output)
        cpu0 = self._cpu_ms()
        end = supervise_cell(
            _Cell(self, out, err),
            encode(kernel_message(self._cell_seq, code, scope)),
            cell_id=self._cell_seq,
            timeout_s=timeout_s,
            hard_deadline=hard_deadline,
            cancel=cancel,
        )
        ended_why = end.ended_why
        cg = self.cgroup.usage() if self.cgroup is not None else None
        if ended_why is not None:
            self._kill()
            cg = self.cgroup.usage() if self.cgroup is not None else cg
            self._drain(out, err)
        cpu1 = self._cpu_ms(cg)
        usage = Usage(
            wall_ms=round(end.wall_ms, 3),
            cpu_ms=round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
            peak_memory_bytes=cg.peak_memory_bytes if cg is not None else self._peak_rss(),
        )
        outcome, reason, code_, sig = classify_cell(
            reply=end.reply,
            stopped_by=end.stopped_by,
            ended_why=ended_why,
            timeout_s=timeout_s,
            limits=self.limits,
            mode=self.request.mode,
            cg=cg,
            kernel_status=self._reported_status(),
            protocol_error=self._protocol_error,
            cancel=cancel,
            heap_limit_bytes=self.backend.heap_limit(self.request),
            stderr=bytes(err.data),
        )
        if ended_why is not None:
            self.ended = reason
        return CellRun.of(
            (outcome, reason, code_, sig),
            reply=end.reply,
            out=out,
            err=err,
            usage=usage,
            session_ended=self.ended,
        )

    def _drain(self, out: CappedOutput, err: CappedOutput) -> None:
        """Everything already in the output pipes (written before the reply) belongs to the cell."""
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        for stream, sink in ((self.proc.stdout, out), (self.proc.stderr, err)):
            fd = stream.fileno()
            with contextlib.suppress(OSError, ValueError):
                while select.select([fd], [], [], 0)[0]:
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        break
                    sink.add(chunk)

    def _cpu_ms(self, cg: cgroups.CgroupUsage | None = None) -> float | None:
        if self.cgroup is not None:
            usage = cg if cg is not None else self.cgroup.usage()
            return usage.cpu_ms
        if self.kernel_pid is None:
            return None
        try:
            with open(f"/proc/{self.kernel_pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) * 1000 / ticks

    def _peak_rss(self) -> int | None:
        if self.kernel_pid is None:
            return None
        try:
            with open(f"/proc/{self.kernel_pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            return None
        return None

    # -- files -------------------------------------------------------------------------------

    def workspace_view(self) -> Path:
        """The workspace as the host can read it (the helper's namespace for an ordinary user)."""
        return self.prepared.workspace_view(self.proc.pid if self.proc is not None else None)

    def sandbox_path(self, path: str) -> Path:
        """A path inside the live sandbox, as the host can read it."""
        pid = self.kernel_pid if self.kernel_pid is not None else self.sandbox_pid
        return Path(f"/proc/{pid}/root{path}")

    def files(self) -> list[str]:
        return workspace.list_files(self.workspace_view())

    def export(self, globs: Sequence[str], collect: Collector) -> Exported:
        # ``collect`` carries the globs and the host's checks; the workspace is a host view.
        del globs
        return collect(self.workspace_view())

    def outputs(self, out_dir: str, store: ArtifactStore) -> DisplayCollection:
        # The kernel (the cell's own process) names the directory: only a cell's directory under
        # the outputs root is read, each part opened without following a link the cell planted.
        name = out_dir.removeprefix(SESSION_OUTPUTS_DIR + "/")
        if name == out_dir or not _CELL_DIR.fullmatch(name):
            return refused_outputs(
                f"the kernel named {out_dir[:200]!r}, not a cell's output directory"
            )
        parts = (*SESSION_OUTPUTS_DIR.strip("/").split("/"), name)
        return read_outputs_below(self.sandbox_path("/"), parts, store)

    def enforcement(self) -> Enforcement:
        base = self.backend.enforcement(self.request, self.layers, self.sockets)
        layers = {
            **base.layers,
            "session": "one sandbox for the whole session; per cell: wall time (SIGINT, then "
            "the session is killed), output caps; memory, processes and CPU time are the "
            "session's",
        }
        return replace(base, layers=layers)

    # -- state -------------------------------------------------------------------------------

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        return session_state.PAUSE_MODES

    def save(self, state_dir: Path, *, mode: PauseMode, keep_running: bool) -> SavedState:
        """Files only (``session_state.py``); without ``keep_running`` the sandbox is killed
        first and the session's teardown follows."""
        return session_state.save(self, state_dir, mode=mode, keep_running=keep_running)

    def metrics(self) -> SandboxMetrics:
        if self.ended is not None or self.sandbox_pid is None:
            raise InfraError(f"the session's sandbox has no metrics: it has ended ({self.ended})")
        return self._metrics.sample(
            cgroup=self.cgroup,
            sandbox_pid=self.sandbox_pid,
            kernel_pid=self.kernel_pid,
            workspace=self.workspace_view(),
        )

    # -- the end -----------------------------------------------------------------------------

    def _kill(self) -> None:
        self.prepared.kill_all()
        if self.sandbox_pid is not None:
            kill_sandbox(self.sandbox_pid, self.proc if self.helper is None else None)

    def teardown(self, globs: Sequence[str] = (), collect: Collector | None = None) -> Exported:
        """Kill the sandbox, let ``collect`` read the quiescent workspace, remove everything."""
        exported: Exported = ((), ())
        if self._torn_down:
            return exported
        self._torn_down = True
        if self.ended is None:
            self.ended = "closed"
        try:
            if self._sock is not None:
                self._sock.close()
            self._kill()
            if self.proc is not None:
                if self.helper is None:
                    reap(self.proc)
                else:
                    with contextlib.suppress(InfraError):
                        self.helper.read_result(time.monotonic() + 10)
            wanted = collect is not None and bool(globs)
            if wanted and self.proc is not None and self.sandbox_pid is not None:
                assert collect is not None
                exported = collect(self.workspace_view())
        finally:
            if self.helper is not None:
                self.helper.release()
                if self.proc is not None:
                    reap(self.proc)
            self._keeper_stop.set()
            self._keeper_done.wait(timeout=10)
            if self.proc is not None:
                for stream in (self.proc.stdout, self.proc.stderr):
                    if stream is not None:
                        stream.close()
            if self._status_r is not None:
                with contextlib.suppress(OSError):
                    os.close(self._status_r)
                self._status_r = None
            self.prepared.kill_all()
            self.prepared.remove()
        return exported

    def alive(self) -> bool:
        return self.ended is None and self.proc is not None and self.proc.poll() is None


class _Cell(CellRung):
    """One cell as :func:`~sandcell.backends.cell.loop.supervise_cell` reaches it: the
    channel's socket, the kernel's output pipes, SIGINT to the kernel's host pid."""

    def __init__(self, sandbox: SessionSandbox, out: CappedOutput, err: CappedOutput) -> None:
        self.sandbox, self.out, self.err = sandbox, out, err

    def send(self, message: bytes) -> None:
        assert self.sandbox._sock is not None
        with contextlib.suppress(OSError):
            self.sandbox._sock.sendall(message)

    def next_message(self) -> dict[str, object] | None:
        return self.sandbox._next_message()

    def pump(self, timeout_s: float) -> str | None:
        return self.sandbox._pump(self.out, self.err, timeout_s)

    def interrupt(self) -> None:
        if self.sandbox.kernel_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.sandbox.kernel_pid, signal.SIGINT)

    def settle(self) -> None:
        self.sandbox._drain(self.out, self.err)


__all__ = ["INTERRUPT_GRACE_S", "SessionSandbox"]
