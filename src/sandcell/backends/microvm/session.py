"""The sandbox of one session on the microVM backend: one VM kept alive across cells.

The VM starts the fastest way the backend has: a pooled clone of the snapshot (``--start pool``),
else one restored at call time (``template``, or without warm starts a clone of the snapshot this
user's processes share, where one is saved), else a cold boot; the record's enforcement says
which. Every way starts the image of the session's runtime (a pool of another runtime's image
starts it cold). The host then sends the agent a session job (``Q``: the run's job with the
namespaces backend's kernel, ``_kernel.py``, and its display module, or a JavaScript or
TypeScript session's Node kernel, ``_kernel.mjs``: :func:`~sandcell.backends.cell.kernel.
guest_kernel`), the inputs, the cache packages (verified on the host, ``guest_packages.py``) and
``G``; the agent sets up
the workspace, cgroup and identity as for a run and has the runner become the kernel, unprivileged
with the run's rlimits, in the program's cgroup (memory and pids of the whole session).

Cells travel as the kernel's own framed messages inside ``C`` frames, replies come back inside ``M``
frames, output as ``O``/``E`` while the cell runs (capped per cell by the agent as well as here;
what is kept goes to the cell's output sink as it arrives). Everything the guest sends is hostile:
frame types and sizes are checked by the channel, kernel messages by the bounded decoder
(:mod:`sandcell.backends.cell.channel`), files by :class:`~.transfer.FileSink` and then the host's
export checks (``collect``) or :func:`sandcell.display.read_outputs` on the host copy.

A cell's wall time is enforced from here with an interrupt (``I``: SIGINT to the kernel, the
state kept) by the loop every rung shares (:func:`sandcell.backends.cell.loop.supervise_cell`);
a kernel that does not return within :data:`~sandcell.backends.cell.verdict.INTERRUPT_GRACE_S`, the
session's end of life, or a kernel that died ends the session, and the VM is killed. Verdicts
come from :func:`sandcell.backends.cell.verdict.classify_cell` with the guest cgroup's usage, so a
cell's outcome means the same on every rung.

A session saves itself (its memory or its files) and comes back from a saved state through
``session_pause.py`` and ``session_state.py``: QEMU's own migration stream with the RAM in a file
that restored copies map copy-on-write, fresh entropy and the clock given to each copy.

The VM is acquired on a keeper thread that lives until teardown: the jailed QEMU's bubblewrap dies
with the thread that started it (``--die-with-parent``), so a session opened from a short-lived
thread keeps its VM. If the supervisor dies, the jail takes QEMU with it and the backend's
:func:`~sandcell.backends.microvm.sweep` removes the run directory and the jail's cgroup.

Security limitations: those of the microVM backend and of namespaces sessions: memory, processes
and CPU time are the session's, not a cell's; files exported while the session lives can be
changed by a process a cell left running (export at close for a quiescent workspace). A session
VM from the pool shares the snapshot's pre-run memory like a run's, reseeded the same way.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
from sandcell.backends.cell.kernel import guest_kernel
from sandcell.backends.cell.loop import CellRung, supervise_cell
from sandcell.backends.cell.state import PauseMode, RestorePoint, SandboxMetrics, SavedState
from sandcell.backends.cell.verdict import CellCancel, classify_cell
from sandcell.backends.host.cgroups import CgroupUsage
from sandcell.backends.host.layout import SESSION_OUTPUTS_DIR
from sandcell.backends.host.warm_runtime import importable_preload
from sandcell.backends.microvm import (
    channel,
    guest_packages,
    layout,
    machine,
    relay,
    session_pause,
    session_state,
    snapshot,
)
from sandcell.backends.microvm.drive import NO_RELAY, job_doc
from sandcell.backends.microvm.pool import SNAPSHOT_MEMORY_BYTES, WarmVMs
from sandcell.backends.microvm.session_pause import RESUMED, USAGE
from sandcell.backends.microvm.transfer import (
    FileSink,
    TransferError,
    check_path,
    input_frames,
    input_items,
)
from sandcell.backends.microvm.vm import VM
from sandcell.backends.warm import WarmConfig
from sandcell.display import DisplayCollection, read_outputs
from sandcell.errors import InfraError
from sandcell.run_sockets import SandboxSockets
from sandcell.spec import Artifact, Enforcement, RejectedExport, RunRequest, StartInfo, Usage

if TYPE_CHECKING:
    from sandcell.backends.microvm import MicroVMBackend

SETUP_TIMEOUT_S = 90.0
ACK_TIMEOUT_S = 20.0
"""How long the agent has to acknowledge the session job (it does so before anything else)."""
"""How long the guest has to start the kernel after the session job (TCG on a busy host)."""
TRANSFER_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
"""How long the guest has to report its processes stopped at close (TCG on a busy host)."""
MAX_FILES = 20_000
_OUT_DIR = re.compile("^" + re.escape(SESSION_OUTPUTS_DIR) + r"/[0-9]{1,15}$")
_SIGKILL_STATUS = 9
"""The wait status of a process killed by SIGKILL: what a VM that stopped means for its kernel."""

# host -> guest (besides the run's INPUT, DATA, GO and KILL)
SESSION = b"Q"
CELL = b"C"
INTERRUPT = b"I"
LIST = b"T"
SEND = b"U"
# guest -> host (besides the run's STDOUT, STDERR, EXIT, FILE, DATA, SKIPPED, DONE, FAILED)
ACK = b"q"
KERNEL = b"M"
STATS = b"a"
NAMES = b"N"
GUEST_TYPES = channel.GUEST_TYPES | {ACK, KERNEL, STATS, NAMES, RESUMED, USAGE}


@dataclass(slots=True)
class _Received:
    """Files the guest sent into a host directory."""

    root: Path
    stand_ins: set[str] = field(default_factory=set)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failure: str | None = None


class VMSessionSandbox:
    """One live VM running a kernel (see module). Not thread-safe: the session serialises."""

    def __init__(
        self,
        backend: MicroVMBackend,
        request: RunRequest,
        *,
        session_id: str,
        warm: WarmVMs | None,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> None:
        self.restore = restore
        """The state :meth:`start` brings back, or None to start empty."""
        self.backend = backend
        self.sockets = sockets
        self._relay: relay.Pump | None = None
        self.warm = warm
        self.request = request
        self.session_id = session_id
        self.limits = request.effective_limits
        # Verified and read before any VM starts: a tampered cache entry refuses the session.
        self.packages = guest_packages.load(request.packages)
        self.memory_mib = machine.guest_mib(self.limits.memory_bytes) + self.packages.extra_mib
        self.start_info = StartInfo()
        self.start_note: str | None = None
        self.vm: VM | None = None
        self.ended: str | None = None
        self._decoder = FrameDecoder(max_bytes=MAX_KERNEL_MESSAGE)
        self._messages: list[dict[str, object]] = []
        self._stats: dict[str, object] = {}
        self._stats_due = False
        """A kernel message came and the usage the agent sends right after it has not yet."""
        self._exit: dict[str, object] | None = None
        self._protocol_error: str | None = None
        self._acked = False
        self._cell_seq = 0
        self._transfers = 0
        self._torn_down = False
        self._keeper_stop = threading.Event()
        self._keeper_done = threading.Event()
        self._replies: dict[bytes, dict[str, object]] = {}
        """The guest's last answer to ``Y`` and ``V``."""
        self._sample: tuple[float, float] | None = None
        """When :meth:`metrics` last sampled, and the guest's CPU time then."""

    # -- the CellSandbox protocol's properties ---------------------------------------------

    @property
    def sandbox_pid(self) -> int | None:
        return self.vm.pid if self.vm is not None else None

    @property
    def run_dir(self) -> Path:
        if self.vm is not None:
            return self.vm.run_dir
        return layout.runs_root() / layout.owner_tag() / f"session-{self.session_id[:12]}"

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Get a VM on the keeper thread, then start the kernel. Cleans up on error."""
        try:
            got: queue.Queue[BaseException | None] = queue.Queue()
            threading.Thread(
                target=self._keeper,
                args=(got,),
                name=f"sandcell-vm-session-{self.session_id}",
                daemon=True,
            ).start()
            error = got.get()
            if error is not None:
                raise error
            if self._memory_restore:
                session_pause.resume(self)
            else:
                self._start_kernel()
            self._sample = (time.monotonic(), self._cpu_ms() or 0.0)
        except BaseException:
            self.teardown()
            raise

    def _keeper(self, got: queue.Queue[BaseException | None]) -> None:
        try:
            self.vm = self._acquire()
        except BaseException as exc:
            got.put(exc)
            self._keeper_done.set()
            return
        got.put(None)
        # Held until teardown: the jailed QEMU dies with this thread (see module).
        self._keeper_stop.wait()
        self._keeper_done.set()

    @property
    def _memory_restore(self) -> bool:
        return self.restore is not None and self.restore.saved.mode is PauseMode.MEMORY

    def _acquire(self) -> VM:
        if self._memory_restore:
            return session_pause.restored_vm(self)
        warm = self.warm
        snapshot_mib = machine.guest_mib(SNAPSHOT_MEMORY_BYTES)
        fits = self.packages.fits(snapshot_mib, self.limits.memory_bytes)
        if warm is not None and not fits:
            self.start_note = "the session's packages do not fit a pooled VM's memory"
        elif warm is not None:
            taken = warm.take(self.request)
            if isinstance(taken, str):
                self.start_note = taken
            else:
                vm, self.start_info = taken
                self.memory_mib = warm.memory_mib
                return vm
        name = f"session-{self.session_id[:12]}"
        if warm is None and fits:
            restored = self._restore_shared(name)
            if restored is not None:
                return restored
        guest = self.backend.guest_for(self.request)
        return machine.boot(guest, memory_mib=self.memory_mib, name=name, savable=True)

    def _restore_shared(self, name: str) -> VM | None:
        """A clone of the snapshot this user's processes share, where one is saved and fits
        the session's memory limit (a backend without a pool starts no snapshot itself)."""
        t0 = time.monotonic()
        if self.limits.memory_bytes > SNAPSHOT_MEMORY_BYTES:
            return None
        # The session's runtime's image, and the preload a pool of that runtime would have.
        guest = self.backend.guest_for(self.request)
        preload = importable_preload(WarmConfig().preload, self.request.runtime)
        snap = snapshot.find_cached(
            guest, memory_mib=machine.guest_mib(SNAPSHOT_MEMORY_BYTES), preload=preload
        )
        if snap is None:
            return None
        try:
            vm = snapshot.restore(guest, snap, name=name)
        except (InfraError, OSError) as exc:
            self.start_note = f"the shared snapshot could not be restored: {exc}"
            return None
        self.memory_mib = snap.memory_mib
        self.start_info = StartInfo(
            mode="template",
            template=f"vm-snapshot-{snap.id}",
            preloaded=snap.preload,
            wait_ms=round((time.monotonic() - t0) * 1000, 3),
        )
        return vm

    def _start_kernel(self) -> None:
        vm = self.vm
        assert vm is not None and vm.chan is not None
        vm.chan.reader.allowed = GUEST_TYPES
        lim = self.limits
        request = replace(self.request, code="", exports=(), display=False, stdin=b"")
        job = job_doc(
            request,
            run_id=self.session_id,
            export_budget=self._budget(),
            packages=self.packages,
            sockets=self.sockets,
        )
        # The kernel of the session's language (Node's for JavaScript and TypeScript).
        job |= guest_kernel(self.request.language, outputs=SESSION_OUTPUTS_DIR)
        try:
            vm.chan.send(SESSION, json.dumps(job).encode())
            for frame in input_frames(input_items(self.request.inputs)):
                vm.chan.send_raw(frame)
            for frame in self.packages.frames():
                vm.chan.send_raw(frame)
            if self.restore is not None:
                # A files-mode state: its files are the workspace before the first cell.
                for frame in session_state.workspace_frames(
                    self.restore.state_dir / session_state.FILES,
                    max_bytes=lim.workspace_bytes,
                    max_entries=lim.workspace_inodes,
                ):
                    vm.chan.send_raw(frame)
            vm.chan.send(channel.GO)
            if self.sockets is not None:
                # From here a relay thread owns the channel (``relay.py``); it stops with it.
                self._relay = relay.Pump(vm.chan, self.sockets)
                self._relay.start()
        except channel.ChannelError as exc:
            raise InfraError(f"the session job could not be sent to the guest: {exc}") from None
        out, err = CappedOutput(lim.stdout_bytes), CappedOutput(lim.stderr_bytes)
        sent = time.monotonic()
        deadline = sent + SETUP_TIMEOUT_S
        while True:
            if not self._acked and time.monotonic() > sent + ACK_TIMEOUT_S:
                raise InfraError(
                    f"the guest agent did not take the session job within {ACK_TIMEOUT_S:g} s: "
                    "its image was built before sessions existed, or the guest is stuck; "
                    "rebuild it: sandcell vm build"
                )
            msg = self._messages.pop(0) if self._messages else None
            if msg is not None:
                if msg.get("op") != "hello":
                    raise InfraError(f"the session kernel said {str(msg)[:200]!r} instead of hello")
                if self._relay is not None and self._relay.ready is None:
                    raise InfraError(NO_RELAY)
                # The usage the first cell's CPU time counts from.
                self._await_stats()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InfraError(
                    f"the guest did not start the session kernel within {SETUP_TIMEOUT_S:g} "
                    f"s: {vm.console() or 'no console output'}"
                )
            if self._pump(out, err, min(remaining, 1.0)) == "ended":
                why = self._protocol_error or err.data.decode(errors="replace").strip()
                raise InfraError(
                    "the session's VM ended before its kernel started: "
                    + (why or vm.console() or "no error output")
                )

    def _budget(self) -> int:
        return self.limits.workspace_bytes + (64 << 20)

    # -- the channel -------------------------------------------------------------------------

    def _pump(
        self, out: CappedOutput | None, err: CappedOutput | None, timeout_s: float
    ) -> str | None:
        """Handle the frames that arrive within ``timeout_s``. Returns ``"ended"`` once the
        kernel or the VM is gone, ``"stdout"``/``"stderr"`` when a cap was passed, else None.
        Output outside a cell (``out``/``err`` None) is dropped."""
        vm = self.vm
        assert vm is not None and vm.chan is not None
        if self._exit is not None or self._protocol_error is not None:
            return "ended"
        try:
            kind, payload = vm.chan.recv(time.monotonic() + max(timeout_s, 0.0))
        except channel.ChannelTimeout:
            return None if vm.alive() else self._vm_gone()
        except channel.ChannelError as exc:
            # The channel closes as QEMU exits (a guest that powered off or panicked).
            with contextlib.suppress(subprocess.TimeoutExpired):
                vm.proc.wait(timeout=2)
            return self._vm_gone() if not vm.alive() else self._broken(str(exc))
        capped: str | None = None
        while True:
            event = self._frame(kind, payload, out, err)
            if event == "ended":
                return event
            capped = capped or event
            if not vm.chan.pending:
                return capped
            kind, payload = vm.chan.pending.pop(0)

    def _frame(
        self, kind: bytes, payload: bytes, out: CappedOutput | None, err: CappedOutput | None
    ) -> str | None:
        if kind == channel.STDOUT:
            return "stdout" if out is not None and out.add(payload) else None
        if kind == channel.STDERR:
            return "stderr" if err is not None and err.add(payload) else None
        if kind == KERNEL:
            self._stats_due = True
            self._decoder.feed(payload)
            try:
                self._messages += list(self._decoder.messages())
            except ChannelError as exc:
                return self._broken(str(exc))
            return None
        if kind == ACK:
            self._acked = True
            return None
        if kind in (RESUMED, USAGE):
            self._replies[kind] = _json_object(payload) or {}
            return None
        if kind == STATS:
            doc = _json_object(payload)
            self._stats_due = False
            if doc is not None:
                self._stats = doc
            return None
        if kind == channel.EXIT:
            self._exit = _json_object(payload) or {}
            return "ended"
        if kind == channel.FAILED:
            return self._broken("the guest agent failed: " + payload[:300].decode(errors="replace"))
        return self._broken(f"the guest sent an unexpected frame {kind!r}")

    def _broken(self, why: str) -> str:
        self._protocol_error = self._protocol_error or why
        return "ended"

    def _vm_gone(self) -> str:
        if self._exit is None:
            self._exit = {"status": _SIGKILL_STATUS}
        return "ended"

    def _send(self, kind: bytes, payload: bytes = b"") -> bool:
        assert self.vm is not None and self.vm.chan is not None
        try:
            self.vm.chan.send(kind, payload)
        except channel.ChannelError:
            return False
        return True

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
        if self.ended is not None or self.vm is None:
            raise InfraError(f"the session's VM has ended: {self.ended}")
        self._cell_seq += 1
        # What each keeps goes to ``on_output`` as it arrives (the agent sends it as written).
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
        if ended_why is not None:
            self._kill()
        cg = self._usage()
        cpu1 = cg.cpu_ms
        usage = Usage(
            wall_ms=round(end.wall_ms, 3),
            cpu_ms=round(max(cpu1 - cpu0, 0.0), 3)
            if cpu0 is not None and cpu1 is not None
            else None,
            peak_memory_bytes=cg.peak_memory_bytes,
        )
        outcome, reason, code_, sig = classify_cell(
            reply=end.reply,
            stopped_by=end.stopped_by,
            ended_why=ended_why,
            timeout_s=timeout_s,
            limits=self.limits,
            mode=self.request.mode,
            cg=cg,
            kernel_status=self._kernel_status(),
            protocol_error=self._protocol_error,
            cancel=cancel,
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

    def _await_stats(self) -> None:
        """The agent follows each kernel message with the cgroup's usage: wait for it briefly.

        Waited for only while it is due: it often comes in the same read as the message, and was
        then handled with it (a wait for one more would stall until the deadline)."""
        deadline = time.monotonic() + 5.0
        while self._stats_due and time.monotonic() < deadline:
            if self._pump(None, None, deadline - time.monotonic()) == "ended":
                return

    def _usage(self) -> CgroupUsage:
        """The guest cgroup's usage, from the kernel's end report if it ended, else the last."""
        doc = self._exit if self._exit is not None and "cpu_ms" in self._exit else self._stats
        cpu = doc.get("cpu_ms")
        peak = doc.get("peak_bytes")
        oom = doc.get("oom_kill")
        return CgroupUsage(
            cpu_ms=float(cpu) if isinstance(cpu, int | float) and _number(cpu) else None,
            peak_memory_bytes=peak if isinstance(peak, int) and _number(peak) else None,
            oom_killed=isinstance(oom, int) and _number(oom) and oom > 0,
            pids_limit_hit=False,
        )

    def _cpu_ms(self) -> float | None:
        return self._usage().cpu_ms

    def _kernel_status(self) -> int | None:
        if self._exit is None:
            return None
        status = self._exit.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 0xFFFF:
            return None
        return status

    # -- files -------------------------------------------------------------------------------

    def files(self) -> list[str]:
        if self.ended is not None or self.vm is None or not self._send(LIST):
            raise InfraError(f"the session's VM has ended: {self.ended}")
        found: list[str] = []

        def names(kind: bytes, payload: bytes) -> None:
            if kind != NAMES:
                raise InfraError(f"the guest answered a file listing with {kind!r}")
            for name in _json_list(payload):
                if len(found) >= MAX_FILES:
                    return
                with contextlib.suppress(TransferError):
                    check_path(name)
                    found.append(str(name))

        self._transfer(names, time.monotonic() + TRANSFER_TIMEOUT_S)
        return sorted(found)

    def _transfer(self, on_file: Callable[[bytes, bytes], None], deadline: float) -> None:
        """Hand the frames of one listing or transfer to ``on_file`` up to its ``Z``; the
        kernel's messages and usage on the way are kept, output between cells is dropped."""
        vm = self.vm
        assert vm is not None and vm.chan is not None
        refused: TransferError | None = None
        while True:
            try:
                kind, payload = vm.chan.recv(deadline)
            except channel.ChannelError as exc:
                raise InfraError(f"the guest did not finish sending files: {exc}") from None
            if kind == channel.DONE:
                if refused is not None:
                    raise refused
                return
            if kind in (NAMES, channel.FILE, channel.DATA, channel.SKIPPED):
                # After a refusal the rest is read and dropped: the channel stays in step.
                if refused is None:
                    try:
                        on_file(kind, payload)
                    except TransferError as exc:
                        refused = exc
            elif self._frame(kind, payload, None, None) == "ended" and kind != channel.EXIT:
                raise InfraError(f"the session's VM failed: {self._protocol_error}")

    def _receive(self, root: str, globs: Sequence[str]) -> _Received:
        """Ask the agent for files (``root``: the workspace or a display directory) and write
        them into a new host directory under the VM's run directory."""
        vm = self.vm
        assert vm is not None
        self._transfers += 1
        got = _Received(root=vm.run_dir / f"files-{self._transfers}")
        budget = self._budget()
        sink = FileSink(got.root, max_bytes=budget, max_entries=MAX_FILES)

        def into_sink(kind: bytes, payload: bytes) -> None:
            if kind == channel.FILE:
                sink.header(payload)
            elif kind == channel.DATA:
                sink.data(payload)
            elif kind == channel.SKIPPED:
                _skipped(got, sink, payload)
            else:
                raise TransferError(f"unexpected frame {kind!r} among files")

        try:
            request = {"root": root, "globs": list(globs), "budget": budget}
            if not self._send(SEND, json.dumps(request).encode()):
                got.failure = "the guest's channel is closed"
                return got
            self._transfer(into_sink, time.monotonic() + TRANSFER_TIMEOUT_S)
            if sink.expecting_data:
                got.failure = "a file ended early"
        except (TransferError, InfraError) as exc:
            got.failure = str(exc)
        finally:
            sink.close()
        return got

    def _exported(self, globs: Sequence[str], collect: Collector) -> Exported:
        got = self._receive("/sandbox", globs)
        try:
            if got.failure is not None:
                why = f"nothing exported: {got.failure}"
                return (), (RejectedExport(path=".", reason=why),)
            artifacts, rejected = collect(got.root)
            leaked = [a for a in artifacts if a.path in got.stand_ins]
            kept: tuple[Artifact, ...] = tuple(a for a in artifacts if a.path not in got.stand_ins)
            rejected += tuple(
                RejectedExport(path=a.path, reason="too large to send from the guest")
                for a in leaked
            )
            rejected += tuple(
                RejectedExport(path=p, reason=f"{k} in the guest: not exported")
                for p, k in got.skipped
            )
            return kept, rejected
        finally:
            _remove(got.root)

    def export(self, globs: Sequence[str], collect: Collector) -> Exported:
        if self.ended is not None or self.vm is None:
            raise InfraError(f"the session's VM has ended: {self.ended}")
        return self._exported(globs, collect)

    def outputs(self, out_dir: str, store: ArtifactStore) -> DisplayCollection:
        if not _OUT_DIR.match(out_dir) or self.vm is None or self.ended is not None:
            return DisplayCollection()
        got = self._receive(out_dir, ["**"])
        try:
            return read_outputs(got.root, store)
        finally:
            _remove(got.root)

    def enforcement(self) -> Enforcement:
        base = self.backend.enforcement(self.request, self.memory_mib, self.sockets)
        started = (
            f"restored from a saved {self.restore.saved.mode.value} state"
            if self.restore is not None
            else f"a {self.start_info.mode} start from snapshot {self.start_info.template}"
            if self.start_info.mode != "cold"
            else "a cold boot" + (f" ({self.start_note})" if self.start_note else "")
        )
        layers = {
            **base.layers,
            "session": f"one VM for the whole session ({started}); per cell: wall time "
            "(SIGINT, then the VM is killed), output caps; memory, processes and CPU time are "
            "the session's",
        }
        return replace(base, layers=layers)

    # -- pause, fork, snapshot (``session_pause.py``) ----------------------------------------

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        return session_pause.pause_modes(self)

    def save(self, state_dir: Path, *, mode: PauseMode, keep_running: bool) -> SavedState:
        return session_pause.save(self, state_dir, mode=mode, keep_running=keep_running)

    def metrics(self) -> SandboxMetrics:
        return session_pause.metrics(self)

    # -- the end -----------------------------------------------------------------------------

    def _kill(self) -> None:
        if self.vm is not None:
            self.vm.kill()

    def teardown(self, globs: Sequence[str] = (), collect: Collector | None = None) -> Exported:
        """Kill everything in the guest, export from the quiescent workspace, destroy the VM."""
        exported: Exported = ((), ())
        if self._torn_down:
            return exported
        self._torn_down = True
        alive = self.ended is None
        if self.ended is None:
            self.ended = "closed"
        try:
            vm = self.vm
            if vm is not None and alive and vm.alive() and vm.chan is not None:
                if self._exit is None and self._send(channel.KILL):
                    deadline = time.monotonic() + STOP_TIMEOUT_S
                    while self._exit is None and time.monotonic() < deadline:
                        if self._pump(None, None, deadline - time.monotonic()) == "ended":
                            break
                if collect is not None and globs:
                    if self._exit is not None:
                        exported = self._exported(globs, collect)
                    else:
                        why = "nothing exported: the guest did not report its processes stopped"
                        exported = ((), (RejectedExport(path=".", reason=why),))
        finally:
            if self.vm is not None:
                self.vm.destroy()
            self._keeper_stop.set()
            self._keeper_done.wait(timeout=10)
        return exported


class _Cell(CellRung):
    """One cell as :func:`~sandcell.backends.cell.loop.supervise_cell` reaches it: ``C``
    frames out, the kernel's messages and output in frames, ``I`` to interrupt, and after the
    reply the usage the agent sends with it. Messages queued with the kernel's end are read
    first: a quick cell's output, reply and end arrive in one batch of frames."""

    reads_past_end = True

    def __init__(self, sandbox: VMSessionSandbox, out: CappedOutput, err: CappedOutput) -> None:
        self.sandbox, self.out, self.err = sandbox, out, err

    def send(self, message: bytes) -> None:
        for i in range(0, len(message), channel.MAX_FRAME):
            self.sandbox._send(CELL, message[i : i + channel.MAX_FRAME])

    def next_message(self) -> dict[str, object] | None:
        messages = self.sandbox._messages
        return messages.pop(0) if messages else None

    def pump(self, timeout_s: float) -> str | None:
        return self.sandbox._pump(self.out, self.err, timeout_s)

    def interrupt(self) -> None:
        self.sandbox._send(INTERRUPT)

    def settle(self) -> None:
        self.sandbox._await_stats()


def _json_object(payload: bytes) -> dict[str, object] | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _json_list(payload: bytes) -> list[object]:
    try:
        doc = json.loads(payload)
    except ValueError:
        return []
    return doc if isinstance(doc, list) else []


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _skipped(got: _Received, sink: FileSink, payload: bytes) -> None:
    doc = _json_object(payload)
    if doc is None or not isinstance(doc.get("path"), str):
        return
    path, kind = str(doc["path"]), str(doc.get("kind"))
    if sink.stand_in(path, kind, doc.get("size")):
        got.stand_ins.add(path)
    elif len(got.skipped) < 64:
        got.skipped.append((path[:200], kind[:40]))


def _remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
        shutil.rmtree(root.with_name(root.name + ".links"))


__all__ = ["VMSessionSandbox"]
