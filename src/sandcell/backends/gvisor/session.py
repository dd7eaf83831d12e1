"""The sandbox of one session on the gVisor backend: one ``runsc`` sandbox kept alive across cells.

Built like a cold run (:class:`~sandcell.backends.gvisor.sandbox.GSandbox`): layers decided and
failed closed, a run directory with a size-capped workspace tmpfs (or the rootless workspace
helper), the session's cgroup, the bundle, and the agent as the container's first process. The
agent runs in channel mode (``_agent.py``): its stdin is one end of a socket pair, the cell
channel (:mod:`sandcell.backends.cell.channel`); it reads its request line from it, forks, installs
the rlimits and the seccomp filter in the child and hands over to the boot, which starts the
session's kernel in place of a program: the namespaces backend's ``_kernel.py``, or for a
JavaScript or TypeScript session its Node twin ``_kernel.mjs`` (:mod:`sandcell.backends.cell.kernel`
says which, and how it starts). The agent stays as pid 1:
when the kernel ends, it ends every other process and writes the kernel's wait status as its
exit trailer on stderr, so the host tells how the kernel died. A session that reaches outside
(an egress allowlist, tools) has its socket directory read-only at ``/run/sandcell`` for its
whole life; the agent starts the egress bridge before the kernel, and the kernel puts the
directory's ``lib`` on every cell's ``sys.path``.

The kernel's stdout and stderr are the container's: pipes the host reads while a cell runs;
what arrives between a cell's start and its reply is that cell's output. A cell's wall time is
enforced with SIGINT to the kernel (``runsc kill --pid``: the kernel's pid inside the sentry,
which it reported in its hello; the cell ends, the state stays); when the kernel does not return
within :data:`~sandcell.backends.cell.verdict.INTERRUPT_GRACE_S`, the whole sandbox is killed. The
session's CPU time (the whole sandbox's, gVisor's own work included: gVisor does not enforce
RLIMIT_CPU) is polled from the host while cells run, and the sandbox is killed at the limit.

Rich outputs: the sandbox's ``/tmp`` is the sentry's own tmpfs, which the host cannot read, so
the kernel writes each cell's outputs under :data:`OUTPUTS_DIR` in the workspace (a host tmpfs,
counted in its quota; a cell sees it in its working directory while it runs, as a one-shot run
with rich outputs does). The host opens that directory without following links, reads it with
:func:`sandcell.display.read_outputs` (which treats it as hostile) and removes it, so it is not
exported with the cell's files.

Pause, snapshot and fork: :meth:`GVisorSessionSandbox.save` and a start with a restore point are
:mod:`.session_state`'s (``runsc checkpoint`` / ``runsc restore`` on a new channel, or the
workspace's files only); a restored kernel is ready once it answers a no-op on its new channel.

runsc is started, and waited for, by a keeper thread that lives as long as the session: runsc
dies with the thread that started it (``setpriv --pdeathsig``), so a session opened on a
short-lived worker thread would otherwise die with that thread.

Security limitations: the gVisor backend's (the sentry and gofer are host processes). On top of
them, memory, processes and CPU time are limits of the session, not of a cell: a cell can use up
what the session has left. The CPU time is checked while a cell runs, so a process a cell left
running between cells is only stopped by it at the next cell (or by the idle timeout and the
maximum lifetime). Files are exported while the session is alive, so a process a cell left
running can change them during the export (the export itself still refuses links and special
files); export at close for a quiescent workspace.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.artifacts.store import ArtifactStore
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
from sandcell.backends.cell.verdict import CellCancel, classify_cell
from sandcell.backends.gvisor import cpu_reader, session_state
from sandcell.backends.gvisor import plan as bundle_plan
from sandcell.backends.gvisor._agent import EXIT, STARTED
from sandcell.backends.gvisor.sandbox import (
    GSandbox,
    bridge_argv,
    fixed_for,
    ingress_argv,
    sockets_env,
)
from sandcell.backends.gvisor.supervise import CPU_POLL_S, decode, trailer_tail
from sandcell.backends.host import landlock, node_program, workspace
from sandcell.backends.host.layout import (
    CONTROL_BOOT,
    CONTROL_DIR,
    CONTROL_DISPLAY,
    CONTROL_PLAN,
    PACKAGES_DIR,
    SANDBOX_WORKDIR,
)
from sandcell.display import DISPLAY_DIRNAME, DisplayCollection, read_outputs, refused_outputs
from sandcell.errors import InfraError
from sandcell.run_sockets import SANDBOX_LIB, SandboxSockets
from sandcell.runtimes import common_env, runtime_for
from sandcell.spec import Enforcement, Outcome, RunRequest, Usage

if TYPE_CHECKING:
    from sandcell.backends.gvisor import GVisorBackend

SETUP_TIMEOUT_S = 60.0
END_WAIT_S = 5.0
"""How long the host waits for a dead kernel's sandbox to close its output and exit."""
OUTPUTS_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"
"""Where the kernel writes each cell's rich outputs (``OUTPUTS_DIR/<cell id>``)."""

_READ_CHUNK = 65536
_TRAILER = re.compile(re.escape(EXIT) + rb"(\d{1,10})\n\Z")
_TAIL_BYTES = len(EXIT) + 16
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CELL_DIR = re.compile(r"[0-9]{1,12}")
_PROBE_SCOPE = "\x00sandcell-restore-probe"
"""A scope name no cell can give (the session layer's names are printable): dropping it is
the restored kernel's no-op answer."""


class GVisorSessionSandbox:
    """One live gVisor sandbox running a kernel (see the module). Not thread-safe: the session
    serialises its calls."""

    def __init__(
        self,
        backend: GVisorBackend,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> None:
        self.restore = restore
        """The state :meth:`start` brings back, or None to start empty."""
        self.backend = backend
        self.request = request
        self.session_id = session_id
        self.sockets = sockets
        self.limits = request.effective_limits
        self.host = backend.decide(request)
        self.sb = GSandbox(
            self.host,
            name=backend.new_name(f"s-{session_id}"),
            fixed=fixed_for(request, self.host, sockets),
        )
        self.run_dir = self.sb.run_dir
        self.ended: str | None = None
        self.kernel_pid: int | None = None
        """The kernel's pid inside the sentry (as its hello said)."""
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(max_bytes=MAX_KERNEL_MESSAGE)
        self._messages: list[dict[str, object]] = []
        self._started = False
        self._pre = bytearray()
        self._tail = b""
        self._open: set[int] = set()
        self._keeper_stop = threading.Event()
        self._keeper_done = threading.Event()
        self._keeper_done.set()  # until a keeper starts
        self._cell_seq = 0
        self._torn_down = False
        self._protocol_error: str | None = None
        self._cpu_out = False
        self._cpu_base = 0.0
        self._kernel_status: int | None = None
        self.started_at = 0.0
        """When the kernel became ready (monotonic): metrics count CPU use from there."""
        self._metrics_prev: session_state.Sample | None = None

    @property
    def sandbox_pid(self) -> int | None:
        """The host pid of the sandbox's outermost process (runsc, or the workspace helper)."""
        return self.sb.proc.pid if self.sb.proc is not None else None

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the sandbox and wait for the kernel's hello, or bring back :attr:`restore`
        (:mod:`.session_state`). Cleans up after itself on error."""
        try:
            kernel_name, kernel = kernel_file(self.request.language)
            plan = landlock.boot_plan_json(
                plan=None,
                input_links=[(i.name, f"/inputs/{i.name}") for i in self.request.inputs],
            )
            self.sb.create(channel=True, control={kernel_name: kernel, CONTROL_PLAN: plan.encode()})
            if self.sockets is not None:
                self.sb.attach_sockets(self.sockets)
            resumed = (
                session_state.prepare(self, self.restore) if self.restore is not None else None
            )
            if resumed is not None:
                self.kernel_pid, self._cell_seq = resumed.kernel_pid, resumed.cell_seq
                self._launch(resumed.image)
                # The session's CPU time goes on from what it had used before the save.
                self._cpu_base = (cpu_reader(self.sb)() or 0.0) - resumed.cpu_used_ms
            else:
                self._launch(None)
                assert self._sock is not None
                self._sock.sendall(self._request_line())
                self._await_hello()
                if self.restore is not None:
                    session_state.after_start(self, self.restore)
                # The session's CPU time counts from its kernel's start: runsc's own start-up
                # is not the cells'.
                self._cpu_base = cpu_reader(self.sb)() or 0.0
            self.started_at = time.monotonic()
        except BaseException:
            self.teardown()
            raise

    def _launch(self, image: Path | None) -> None:
        """Start runsc on its keeper thread with a new channel: ``run`` of the bundle, or
        ``restore`` from ``image`` (then wait until the restored kernel answers)."""
        host_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = host_end
        self._decoder = FrameDecoder(max_bytes=MAX_KERNEL_MESSAGE)
        self._messages, self._pre, self._tail = [], bytearray(), b""
        # A restored kernel writes its own stderr: the agent's started marker is long past.
        self._started = image is not None
        started: queue.Queue[BaseException | None] = queue.Queue()
        self._keeper_stop.clear()
        self._keeper_done.clear()
        try:
            # A daemon, so a session left open never holds the interpreter at exit: the
            # sessions module closes live sessions from atexit.
            threading.Thread(
                target=self._keeper,
                args=(started, kernel_end.fileno(), image),
                name=f"sandcell-gvisor-session-{self.session_id}",
                daemon=True,
            ).start()
            error = started.get()
        finally:
            kernel_end.close()
        if error is not None:
            raise error
        proc = self.sb.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        self._open = {proc.stdout.fileno(), proc.stderr.fileno()}
        if image is not None:
            self._await_probe()

    def relaunch(self, image: Path) -> None:
        """Bring this session back in place from ``image``, its own checkpoint (a save that
        keeps it running): same bundle, cgroup and workspace, a new channel. The sandbox ends
        if that fails."""
        try:
            if self._sock is not None:
                self._sock.close()
            self._keeper_stop.set()
            self._keeper_done.wait(timeout=10)
            self.sb.forget_process()
            self._launch(image)
        except BaseException as exc:
            self.ended = f"it could not be restored after its checkpoint: {exc}"
            self.sb.kill()
            raise

    def _await_probe(self) -> None:
        """Wait until a restored kernel answers on its new channel (a drop of a scope no cell
        can name: no code runs), or raise InfraError with what the sandbox said."""
        assert self._sock is not None
        self._sock.sendall(encode({"op": "drop", "id": 0, "scope": _PROBE_SCOPE}))
        out, err = CappedOutput(self.limits.stdout_bytes), CappedOutput(self.limits.stderr_bytes)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            msg = self._next_message()
            if msg is not None:
                if msg.get("op") == "done" and msg.get("id") == 0:
                    return
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InfraError(
                    f"the restored gVisor sandbox did not answer within {SETUP_TIMEOUT_S:g} s"
                )
            if self._pump(out, err, remaining) == "ended":
                said = bytes(err.data).decode(errors="replace").strip()
                raise InfraError(
                    "the restored gVisor sandbox ended before its kernel answered: "
                    + (said[-2000:] or "no error output")
                )

    def _keeper(
        self, started: queue.Queue[BaseException | None], kernel_end: int, image: Path | None
    ) -> None:
        try:
            self.sb.spawn(stdin=kernel_end, image=image)
        except BaseException as exc:
            started.put(exc)
            self._keeper_done.set()
            return
        started.put(None)
        # Held until teardown: runsc dies with this thread.
        self._keeper_stop.wait()
        self._keeper_done.set()

    def _request_line(self) -> bytes:
        """The agent's request: the session's environment and rlimits, the boot's command line
        starting the kernel of the session's language, in its runtime."""
        request = self.request
        rt = runtime_for(request.language, request.runtime)
        paths = [f"{PACKAGES_DIR}/{pkg.name}" for pkg in request.packages]
        if self.sockets is not None:
            paths.append(SANDBOX_LIB)
        kernel = kernel_command(
            request.language,
            rt,
            self.limits,
            request.mode,
            paths=paths,
            display=f"{CONTROL_DIR}/{CONTROL_DISPLAY}",
            outputs=OUTPUTS_DIR,
        )
        boot = [f"{CONTROL_DIR}/{CONTROL_BOOT}", f"{CONTROL_DIR}/{CONTROL_PLAN}", "exec"]
        reserve = node_program.address_reserve(request.language)
        doc: dict[str, object] = {
            "env": {**common_env(), **rt.sandbox_env, **request.env} | sockets_env(self.sockets),
            "rlimits": [
                [r.name, r.value]
                for r in bundle_plan.plan_rlimits(self.limits, request.mode, reserve=reserve)
            ],
            "argv": [*boot, *kernel],
        }
        bridge = bridge_argv(self.sockets, self.request.runtime)
        if bridge is not None:
            # Started by the agent before the kernel, ended with it.
            doc["bridge"] = bridge
        ingress = ingress_argv(self.sockets, self.request.runtime)
        if ingress is not None:
            # The same, so its connection to ingress.sock is the first the host's gate sees.
            doc["ingress"] = ingress
        return json.dumps(doc).encode() + b"\n"

    def _await_hello(self) -> None:
        out, err = CappedOutput(self.limits.stdout_bytes), CappedOutput(self.limits.stderr_bytes)
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            msg = self._next_message()
            if msg is not None:
                if msg.get("op") != "hello" or not isinstance(msg.get("pid"), int):
                    raise InfraError(f"the session kernel said {msg!r} instead of hello")
                self.kernel_pid = int(msg["pid"])  # type: ignore[call-overload]
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InfraError(
                    f"the session's gVisor sandbox did not start its kernel within "
                    f"{SETUP_TIMEOUT_S:g} s"
                )
            if self._pump(out, err, remaining) == "ended":
                said = (bytes(self._pre) + bytes(err.data)).decode(errors="replace").strip()
                raise InfraError(
                    "the session's gVisor sandbox ended before its kernel started: "
                    + (said or "no error output")
                )

    # -- the channel -------------------------------------------------------------------------

    def _next_message(self) -> dict[str, object] | None:
        return self._messages.pop(0) if self._messages else None

    def _pump(self, out: CappedOutput, err: CappedOutput, timeout_s: float) -> str | None:
        """Read whatever is ready for up to ``timeout_s``. Returns ``"ended"`` once the sandbox
        closed the channel or its output, ``"stdout"``/``"stderr"`` when a cap was passed, else
        None."""
        proc = self.sb.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        assert self._sock is not None
        out_fd, err_fd, sock_fd = proc.stdout.fileno(), proc.stderr.fileno(), self._sock.fileno()
        ready, _, _ = select.select([*self._open, sock_fd], [], [], max(timeout_s, 0))
        capped: str | None = None
        ended = False
        for fd in ready:
            if fd == sock_fd:
                try:
                    chunk = self._sock.recv(_READ_CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    ended = True
                    continue
                self._decoder.feed(chunk)
                try:
                    self._messages += list(self._decoder.messages())
                except ChannelError as exc:
                    self._protocol_error = str(exc)
                    ended = True
                continue
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                # runsc holds the channel's other end too: the end of its output is the end.
                self._open.discard(fd)
                ended = True
            elif fd == out_fd:
                if out.add(chunk):
                    capped = capped or "stdout"
            elif fd == err_fd and self._stderr(chunk, err):
                capped = capped or "stderr"
        return "ended" if ended else capped

    def _stderr(self, chunk: bytes, err: CappedOutput) -> bool:
        """File a chunk of the container's stderr: the agent's (before its started marker) or
        the kernel's. True when the cell's stderr cap was passed."""
        if not self._started:
            self._pre += chunk
            at = self._pre.find(STARTED)
            if at < 0:
                del self._pre[: max(len(self._pre) - _READ_CHUNK, 0)]
                return False
            self._started = True
            chunk = bytes(self._pre[at + len(STARTED) :])
            del self._pre[at:]
            if not chunk:
                return False
        self._tail = (self._tail + chunk)[-_TAIL_BYTES:]
        return err.add(chunk)

    def _drain(self, out: CappedOutput, err: CappedOutput, *, until_eof_s: float = 0.0) -> None:
        """Read what is already in the output pipes (written before the reply, so the cell's);
        with ``until_eof_s``, wait that long for the sandbox to close them."""
        deadline = time.monotonic() + until_eof_s
        proc = self.sb.proc
        assert proc is not None and proc.stdout is not None
        out_fd = proc.stdout.fileno()
        while self._open:
            wait = max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select(list(self._open), [], [], wait)
            if not ready:
                return
            for fd in ready:
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    self._open.discard(fd)
                elif fd == out_fd:
                    out.add(chunk)
                else:
                    self._stderr(chunk, err)

    def _finish_dead(self, out: CappedOutput, err: CappedOutput) -> None:
        """After the sandbox ended (or was killed): read its last output, reap it, and learn
        how the kernel ended (the agent's trailer, or runsc's own status)."""
        self._drain(out, err, until_eof_s=END_WAIT_S)
        if self._open:
            self.sb.kill()
            self._drain(out, err, until_eof_s=END_WAIT_S)
        if self.sb.exit_status is None:
            self.sb.wait()
        code, sig = decode(self.sb.exit_status or 0)
        trailer = _TRAILER.search(self._tail)
        if trailer is not None and err.data.endswith(trailer.group(0)):
            del err.data[-len(trailer.group(0)) :]
        if trailer is not None and code == 0 and sig is None:
            # The agent exits 0 only after writing its trailer, once nothing else is alive.
            self._kernel_status = int(trailer.group(1))
        elif sig is not None:
            self._kernel_status = sig
        else:
            self._kernel_status = (code or 0) << 8

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
        # The agent's exit trailer ends stderr when the kernel dies: never passed on live.
        err = CappedOutput(
            self.limits.stderr_bytes, stream="stderr", on_output=on_output, hold=trailer_tail
        )
        cpu_ms = cpu_reader(self.sb)
        cpu0 = cpu_ms()
        end = supervise_cell(
            _Cell(self, out, err, cpu_ms),
            encode(kernel_message(self._cell_seq, code, scope)),
            cell_id=self._cell_seq,
            timeout_s=timeout_s,
            hard_deadline=hard_deadline,
            cancel=cancel,
        )
        ended_why = end.ended_why
        cg = self.sb.cgroup.usage() if self.sb.cgroup is not None else None
        cpu1 = cpu_ms()
        if ended_why is not None:
            if ended_why != "kernel" or self._cpu_out or self._protocol_error is not None:
                self.sb.kill()
            self._finish_dead(out, err)
            cg = self.sb.cgroup.usage() if self.sb.cgroup is not None else cg
            if cg is not None and cg.cpu_ms is not None:
                cpu1 = cg.cpu_ms
        usage = Usage(
            wall_ms=round(end.wall_ms, 3),
            cpu_ms=round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
            peak_memory_bytes=cg.peak_memory_bytes if cg is not None else None,
        )
        outcome, reason, code_, sig = classify_cell(
            reply=end.reply,
            stopped_by=end.stopped_by,
            ended_why=ended_why,
            timeout_s=timeout_s,
            limits=self.limits,
            mode=self.request.mode,
            cg=cg,
            kernel_status=self._kernel_status,
            protocol_error=self._protocol_error,
            cancel=cancel,
            stderr=bytes(err.data),
        )
        if self._cpu_out:
            outcome, code_, sig = Outcome.TIMEOUT, None, signal.SIGKILL
            reason = (
                f"CPU-time limit of {self.limits.cpu_time_s} s for the session reached (the "
                "whole sandbox's CPU time, measured by the host); the session ended"
            )
        if ended_why is not None:
            self.ended = reason
        err.flush()
        return CellRun.of(
            (outcome, reason, code_, sig),
            reply=end.reply,
            out=out,
            err=err,
            usage=usage,
            session_ended=self.ended,
        )

    # -- files -------------------------------------------------------------------------------

    def workspace_view(self) -> Path:
        """The workspace as the host reads it (the helper's mount namespace, rootless)."""
        return self.sb.workspace_view()

    def files(self) -> list[str]:
        return workspace.list_files(self.workspace_view())

    def export(self, globs: Sequence[str], collect: Collector) -> Exported:
        # ``collect`` carries the globs and the host's checks; the workspace is a host view.
        del globs
        return collect(self.workspace_view())

    def outputs(self, out_dir: str, store: ArtifactStore) -> DisplayCollection:
        """Read the cell's outputs under :data:`OUTPUTS_DIR`, then remove that directory."""
        name = out_dir.removeprefix(OUTPUTS_DIR + "/")
        if name == out_dir or not _CELL_DIR.fullmatch(name):
            return refused_outputs(
                f"the kernel named {out_dir[:200]!r}, not a cell's output directory"
            )
        ws_fd = os.open(self.workspace_view(), _OPEN_DIR)
        try:
            try:
                # Not followed: the cell may have put a link where the directory goes, and the
                # workspace is a host path.
                dir_fd = os.open(DISPLAY_DIRNAME, _OPEN_DIR, dir_fd=ws_fd)
            except FileNotFoundError:
                return DisplayCollection()
            except OSError as exc:
                return refused_outputs(
                    f"the output directory cannot be opened safely: {exc.strerror}"
                )
            try:
                # The cell's directory is opened by read_outputs without following a link; the
                # part above it is the descriptor just checked.
                return read_outputs(Path(f"/proc/self/fd/{dir_fd}/{name}"), store)
            finally:
                os.close(dir_fd)
        finally:
            _remove_outputs(ws_fd)
            os.close(ws_fd)

    def enforcement(self) -> Enforcement:
        base = self.backend.enforcement(self.request, self.host, self.sockets)
        layers = {
            **base.layers,
            "session": "one gVisor sandbox for the whole session; per cell: wall time (SIGINT "
            "to the kernel through runsc, then the session is killed), output caps; memory, "
            "processes and CPU time are the session's",
            "display": f"rich outputs written under {OUTPUTS_DIR} in the workspace (its quota), "
            "read by the host without following links and checked as hostile files",
        }
        return replace(base, layers=layers)

    # -- state -------------------------------------------------------------------------------

    @property
    def cell_seq(self) -> int:
        """The id of the last cell sent to the kernel."""
        return self._cell_seq

    @property
    def cpu_base_ms(self) -> float:
        """The sandbox's CPU reading at which the session's CPU time counts zero."""
        return self._cpu_base

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        return session_state.pause_modes(self)

    def save(self, state_dir: Path, *, mode: PauseMode, keep_running: bool) -> SavedState:
        """Save into ``state_dir`` (see :mod:`.session_state`)."""
        return session_state.save(self, state_dir, mode=mode, keep_running=keep_running)

    def metrics(self) -> SandboxMetrics:
        sample, self._metrics_prev = session_state.metrics(self, self._metrics_prev)
        return sample

    def clear_outputs(self) -> None:
        """Remove the outputs' directory from the workspace: sandcell's, not the program's, so
        never exported nor saved."""
        with contextlib.suppress(OSError):
            ws_fd = os.open(self.workspace_view(), _OPEN_DIR)
            try:
                _remove_outputs(ws_fd)
            finally:
                os.close(ws_fd)

    # -- the end -----------------------------------------------------------------------------

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
            if self.sb.proc is not None:
                self.sb.kill()
                if self.sb.exit_status is None:
                    self.sb.wait()
                if collect is not None and globs:
                    self.clear_outputs()
                    exported = collect(self.workspace_view())
        finally:
            self.sb.destroy()
            self._keeper_stop.set()
            self._keeper_done.wait(timeout=10)
        return exported


class _Cell(CellRung):
    """One cell as :func:`~sandcell.backends.cell.loop.supervise_cell` reaches it: the
    channel's socket, the container's output, SIGINT through ``runsc kill``, and the
    session's CPU time polled from the host (gVisor does not enforce RLIMIT_CPU)."""

    check_every_s = CPU_POLL_S

    def __init__(
        self,
        sandbox: GVisorSessionSandbox,
        out: CappedOutput,
        err: CappedOutput,
        cpu_ms: Callable[[], float | None],
    ) -> None:
        self.sandbox, self.out, self.err, self.cpu_ms = sandbox, out, err, cpu_ms

    def send(self, message: bytes) -> None:
        assert self.sandbox._sock is not None
        with contextlib.suppress(OSError):
            self.sandbox._sock.sendall(message)

    def next_message(self) -> dict[str, object] | None:
        return self.sandbox._next_message()

    def pump(self, timeout_s: float) -> str | None:
        return self.sandbox._pump(self.out, self.err, timeout_s)

    def interrupt(self) -> None:
        """SIGINT to the kernel, inside the sentry."""
        sandbox = self.sandbox
        if sandbox.kernel_pid is None:
            return
        rs = sandbox.host.runsc
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                rs.argv("kill", "--pid", str(sandbox.kernel_pid), sandbox.sb.container_id, "INT"),
                capture_output=True,
                timeout=10,
                check=False,
                env={},
                stdin=subprocess.DEVNULL,
            )

    def exhausted(self) -> bool:
        used = self.cpu_ms()
        limit_ms = self.sandbox.limits.cpu_time_s * 1000
        if used is not None and used - self.sandbox._cpu_base >= limit_ms:
            self.sandbox._cpu_out = True
        return self.sandbox._cpu_out

    def settle(self) -> None:
        self.sandbox._drain(self.out, self.err)


def _remove_outputs(ws_fd: int) -> None:
    """Remove the outputs' directory from the workspace (or whatever a cell put in its place)."""
    try:
        st = os.stat(DISPLAY_DIRNAME, dir_fd=ws_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        # rmtree works on descriptors and never follows a link inside.
        shutil.rmtree(DISPLAY_DIRNAME, ignore_errors=True, dir_fd=ws_fd)
    else:
        with contextlib.suppress(OSError):
            os.unlink(DISPLAY_DIRNAME, dir_fd=ws_fd)


__all__ = ["OUTPUTS_DIR", "GVisorSessionSandbox"]
