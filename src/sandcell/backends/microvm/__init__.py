"""The microVM backend: each run in its own QEMU ``microvm`` guest with a dedicated kernel.

:meth:`MicroVMBackend.run` reads as the order of containment:

1. check the request against what a VM offers (fail closed: Landlock asked for by name); verify
   and read its packages from the wheel cache (``guest_packages.py``: they travel with the job);
2. get a VM whose agent is ready: a fresh boot (cold), or one restored from the snapshot (warm:
   ``template`` restores at call time, ``pool`` takes one restored ahead, each used once);
3. drive the run over the agent channel (``drive.py``): job, fresh entropy, inputs, packages,
   stdin in; output (handed to ``on_output`` as it arrives), exit report, exported files out;
   wall time and output caps enforced from here; with run sockets (an allowlist or tools), the
   agent serves ``/run/sandcell`` in the guest and the loopback bridge, and each connection
   travels over the same channel to the host's socket (``relay.py``: a relay thread owns the
   channel from the program's start);
4. kill QEMU, hand the received files to ``collect`` (the host's export checks); reaping QEMU
   and removing every file of the VM happen after the result is returned (a background thread
   that :meth:`MicroVMBackend.close` waits for), as does restoring the pool's next clone.

Each runtime has its own guest image (``image.py``): a run boots the image of its request's
runtime (None: ``default``), and the warm VMs are of ``WarmConfig.runtime``'s image, so a run in
another runtime starts cold. The guest kernel and the image of the pool's runtime (``default``
without warm starts) are verified against their manifest when the backend starts, another
runtime's image at its first run (a tampered one raises IsolationUnavailable, a missing one names
``sandcell vm build --runtime NAME``); QEMU runs jailed (``jail.py``) where the host allows.
A supervisor killed mid-run leaves its QEMU processes, run directories and snapshots behind:
:func:`sweep` (called at every start) removes those whose owner is gone.

Sessions (:meth:`MicroVMBackend.session_sandbox`, ``session.py``) keep one VM alive across cells,
started the same ways, with the session's kernel in the guest.

Security limitations: see ``jail.py`` for the VMM's own confinement. Under TCG, QEMU emulates the
CPU in software: the guest kernel is not the host's, but QEMU's TCG and device emulation are the
attack surface. A restored VM shares the snapshot's pre-run memory image (the preloaded modules,
Python's hash secret): its kernel RNG, ``random`` and numpy's global generator are reseeded before
the program runs, and its clock and hostname are set fresh. The guest image holds the runtime at
the namespaces backend's neutral paths (``/opt/sandcell/venv``), not at its host path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.base import (
    BackendResult,
    BackendStatus,
    Collector,
    OutputSink,
    started_cold,
)
from sandcell.backends.host import node_program
from sandcell.backends.host.runs import RunRegistry
from sandcell.backends.host.sweep import sweep as host_sweep
from sandcell.backends.microvm import (
    accel,
    guest_packages,
    image,
    jail,
    layout,
    machine,
    qemu,
    snapshot,
)
from sandcell.backends.microvm.drive import Ended, classify, drive
from sandcell.backends.microvm.pool import WarmVMs, runtime_of
from sandcell.backends.microvm.vm import VM
from sandcell.backends.warm import WarmConfig, WarmStats
from sandcell.errors import InfraError, IsolationUnavailable, SandcellError
from sandcell.run_sockets import SANDBOX_DIR, SANDBOX_LIB, SandboxSockets
from sandcell.spec import (
    NODE_LANGUAGES,
    Artifact,
    Enforcement,
    IsolationMode,
    Outcome,
    RejectedExport,
    RunRequest,
    StartInfo,
    Usage,
)

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint

MAX_EXPORT_ENTRIES = 20_000


class MicroVMBackend:
    """Runs each program in a fresh microVM (see module). One instance serves many runs."""

    name = "microvm"

    def __init__(self, warm: WarmConfig | None = None) -> None:
        found = qemu.find_qemu()
        self._runtime = runtime_of(warm.runtime if warm is not None else None)
        """The runtime of :attr:`guest` (the pool's)."""
        files = image.verify(runtime=self._runtime)
        sweep()
        self._jail = jail.plan_jail()
        guest = machine.Guest(files=files, qemu=found, accel="tcg", tsc_khz=qemu.host_tsc_khz())
        choice = accel.choose(
            lambda: accel.timed(
                lambda: machine.boot(
                    replace(guest, accel="kvm"), memory_mib=256, name="probe"
                ).destroy()
            )
        )
        self.accel = choice
        self.guest = replace(guest, accel=choice.accel, jail=self._jail)
        self.runs = RunRegistry()
        self._warm = WarmVMs(self.guest, warm) if warm is not None else None
        self._teardowns: set[threading.Thread] = set()
        self._teardown_lock = threading.Lock()
        self._guests = {self._runtime: self.guest}
        self._guests_lock = threading.Lock()

    def guest_for(self, request: RunRequest) -> machine.Guest:
        """The guest of the request's runtime: its image verified at its first use here, and
        again once ``sandcell vm build`` replaced it (one that is missing or tampered with raises
        IsolationUnavailable, naming the command that builds it). The pool keeps the guest it
        was made of: its restores are refused once that image is replaced (``machine.start``),
        and its runs start cold in the new one."""
        name = runtime_of(request.runtime)
        with self._guests_lock:
            found = self._guests.get(name)
            if found is None or image.replaced(found.files):
                found = replace(self.guest, files=image.verify(runtime=name))
                self._guests[name] = found
        if request.language in NODE_LANGUAGES:
            missing = image.node_missing(found.files.manifest)
            if missing is not None:
                raise missing
        return found

    # -- the Backend protocol --------------------------------------------------------------

    def versions(self) -> Mapping[str, str]:
        m = self.guest.files.manifest
        return {
            "qemu": f"{self.guest.qemu.version_text} ({self.guest.qemu.path})",
            "accelerator": f"{self.accel.accel} ({self.accel.why})",
            "guest_kernel": m.kernel_release,
            "guest_kernel_sha256": m.kernel_sha256,
            "guest_image_sha256": m.image_sha256,
            "guest_initrd_sha256": m.initrd_sha256,
        }

    def cancel_all(self, reason: str) -> int:
        return self.runs.cancel_all(reason)

    def cancel(self, run_id: str, reason: str) -> bool:
        return self.runs.cancel(run_id, reason)

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()
        with self._teardown_lock:
            pending = list(self._teardowns)
        for t in pending:
            t.join()
        # This supervisor's run directory, once its VMs are gone (each removed its own).
        with contextlib.suppress(OSError):
            (layout.runs_root() / layout.owner_tag()).rmdir()

    def warm_stats(self) -> WarmStats | None:
        return self._warm.stats() if self._warm is not None else None

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        self._check(request)
        guest = self.guest_for(request)
        packages = guest_packages.load(request.packages)
        start = StartInfo()
        vm: VM | None = None
        note: str | None = None
        run = partial(
            self._run,
            request,
            run_id=run_id,
            collect=collect,
            guest=guest,
            packages=packages,
            sockets=sockets,
            on_output=on_output,
        )
        if self._warm is None:
            return run(vm=vm, start=start)
        with self._warm.refill_held():
            program_bytes = request.effective_limits.memory_bytes
            taken: tuple[VM, StartInfo] | str = "the run's packages do not fit a pooled VM's memory"
            if packages.fits(self._warm.memory_mib, program_bytes):
                taken = self._warm.take(request)
            if isinstance(taken, str):
                note = taken
            else:
                vm, start = taken
            result = run(vm=vm, start=start)
        return result if note is None else started_cold(result, note)

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        """One VM kept alive across the cells of a session (see ``session.py``); not started."""
        from sandcell.backends.microvm.session import VMSessionSandbox

        self._check(request)
        self.guest_for(request)  # a missing or tampered image refuses the session now
        return VMSessionSandbox(
            self, request, session_id=session_id, warm=self._warm, sockets=sockets, restore=restore
        )

    # -- the run ---------------------------------------------------------------------------

    def _check(self, request: RunRequest) -> None:
        if request.landlock is True:
            raise IsolationUnavailable(
                "landlock",
                "the microVM backend gives each run its own kernel instead of Landlock rules",
                "leave landlock unset, or use the namespaces backend",
            )

    def _run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        guest: machine.Guest,
        vm: VM | None,
        start: StartInfo,
        packages: guest_packages.GuestPackages,
        sockets: SandboxSockets | None,
        on_output: OutputSink | None,
    ) -> BackendResult:
        stop = threading.Event()
        # A cold VM gets the RAM its packages' tmpfs takes on top (a pooled one had room).
        memory_mib = machine.guest_mib(request.effective_limits.memory_bytes) + packages.extra_mib
        with self.runs.register(run_id, stop.set) as cancellation:
            try:
                if vm is None:
                    vm = machine.boot(guest, memory_mib=memory_mib, name=run_id[:12])
                else:
                    memory_mib = self._warm.memory_mib if self._warm is not None else memory_mib
            except InfraError as exc:
                if cancellation.cancelled:
                    return self._not_run(
                        request,
                        Outcome.KILLED,
                        f"cancelled: {cancellation.reason}",
                        memory_mib,
                        sockets,
                    )
                return self._not_run(request, Outcome.INFRA_ERROR, str(exc), memory_mib, sockets)
            assert vm.chan is not None
            try:
                sink = vm.run_dir / "export"
                lim = request.effective_limits
                ended = drive(
                    vm.chan,
                    request,
                    run_id=run_id,
                    sink_dir=sink,
                    stop=stop,
                    alive=vm.alive,
                    export_budget=lim.workspace_bytes + (64 << 20),
                    max_entries=MAX_EXPORT_ENTRIES,
                    packages=packages,
                    sockets=sockets,
                    on_output=on_output,
                )
                console = vm.console() if ended.failure else ""
                vm.kill(reap=False)
                artifacts: tuple[Artifact, ...] = ()
                rejected: tuple[RejectedExport, ...] = ()
                if ended.reported and ended.files_complete and sink.is_dir():
                    artifacts, rejected = collect(sink)
                    leaked = [a for a in artifacts if a.path in ended.stand_ins]
                    artifacts = tuple(a for a in artifacts if a.path not in ended.stand_ins)
                    rejected += tuple(
                        RejectedExport(path=a.path, reason="too large to send from the guest")
                        for a in leaked
                    )
                    rejected += tuple(
                        RejectedExport(path=p, reason=f"{k} in the guest: not exported")
                        for p, k in ended.skipped
                    )
                elif ended.reported and (request.exports or request.display):
                    why = ended.failure or "the guest did not send its files"
                    rejected = (RejectedExport(path=".", reason=f"nothing exported: {why}"),)
            finally:
                self._tear_down(vm)
        outcome, reason = classify(
            ended, request, cancel_reason=cancellation.reason, console=console
        )
        return BackendResult(
            outcome=outcome,
            exit_code=ended.exit_code if ended.reported else None,
            signal=ended.signal if ended.reported else None,
            stdout=bytes(ended.stdout),
            stderr=bytes(ended.stderr),
            stdout_truncated=ended.stdout_truncated,
            stderr_truncated=ended.stderr_truncated,
            usage=_usage(ended),
            artifacts=artifacts,
            rejected_exports=rejected,
            enforcement=self.enforcement(request, memory_mib, sockets),
            reason=reason,
            start=start,
        )

    def _tear_down(self, vm: VM) -> None:
        """Kill the VM now; reap it and remove its files off the result path."""
        vm.kill(reap=False)

        def destroy() -> None:
            try:
                vm.destroy()
            finally:
                with self._teardown_lock:
                    self._teardowns.discard(thread)

        thread = threading.Thread(target=destroy, name="sandcell-vm-teardown", daemon=True)
        with self._teardown_lock:
            self._teardowns.add(thread)
        thread.start()

    def _not_run(
        self,
        request: RunRequest,
        outcome: Outcome,
        reason: str,
        memory_mib: int,
        sockets: SandboxSockets | None,
    ) -> BackendResult:
        enforcement = self.enforcement(request, memory_mib, sockets)
        return BackendResult.not_run(outcome, reason, enforcement)

    def enforcement(
        self, request: RunRequest, memory_mib: int, sockets: SandboxSockets | None = None
    ) -> Enforcement:
        lim = request.effective_limits
        # The guest the run was started in (verified by ``guest_for`` before it started).
        with self._guests_lock:
            guest = self._guests.get(runtime_of(request.runtime), self.guest)
        m = guest.files.manifest
        layers = {
            "vmm": f"QEMU {self.guest.qemu.version} microvm, {self.accel.accel}",
            "guest_kernel": f"{m.kernel_release} (sha256 {m.kernel_sha256[:16]}...)",
            "guest_image": f"read-only ext4 of runtime {m.runtime}, sha256 "
            f"{m.image_sha256[:16]}...",
            "devices": "virtio-mmio: read-only root disk, one serial port (agent channel); "
            "no network device, no PCI, no USB, no option ROMs",
            "guest_memory": f"{memory_mib} MiB of guest RAM; the program's cgroup "
            f"memory.max={lim.memory_bytes} bytes, no swap",
            "pids": f"cgroup pids.max={lim.max_pids} and RLIMIT_NPROC in the guest",
            "rlimits": "cpu, file size, open files, processes, core (in the guest)",
            "user": "the program runs as uid 1000 in the guest, no capabilities",
            "workspace_quota": f"tmpfs of {lim.workspace_bytes} bytes in the guest",
            "wall_time_and_output": "enforced by the host: the VM is stopped and destroyed",
            "jailer": self._jail.describe() if self._jail else "none: " + jail.why_not(),
            # The guest's cgroup bounds memory whatever the mode: no rlimits-mode lines.
            **node_program.layers(request.language, IsolationMode.STRICT),
        }
        if request.packages:
            layers["packages"] = (
                f"{len(request.packages)} from the wheel cache, verified against its lock on the "
                f"host, sent in and held read-only under {guest_packages.PACKAGES_DIR} (root's)"
            )
        if sockets is not None:
            layers["run_sockets"] = (
                f"{sockets.describe()}: the guest agent serves {SANDBOX_DIR} (root's; "
                f"sandcell_tools importable from {SANDBOX_LIB}) and carries each connection over "
                "the agent channel to the host's socket (credit flow control, every frame "
                "checked on the host); still no network device, the guest's loopback up"
                + (
                    "; the bridge runs in the guest, forked by the agent under the program's "
                    "uid, cgroup and rlimits, and ends with it"
                    if sockets.egress
                    else ""
                )
                + (
                    "; a session's ingress agent runs the same way and reaches the host's "
                    "ingress gate through the guest's ingress.sock: the host asks it for each "
                    "connection to the program's ports"
                    if sockets.ingress
                    else ""
                )
            )
        return Enforcement(backend=self.name, layers=layers, mode=request.mode)


def _usage(ended: Ended) -> Usage:
    return Usage(
        wall_ms=round(ended.wall_ms, 3),
        cpu_ms=round(ended.cpu_ms, 3) if ended.cpu_ms is not None else None,
        peak_memory_bytes=ended.peak_bytes,
    )


def probe() -> BackendStatus:
    """Whether this host can run microVMs, for ``sandcell doctor`` (boots nothing)."""
    try:
        found = qemu.find_qemu()
        files = image.verify()
    except SandcellError as exc:
        fix = exc.fix if isinstance(exc, IsolationUnavailable) else None
        reason = exc.reason if isinstance(exc, IsolationUnavailable) else str(exc)
        return BackendStatus(name="microvm", usable=False, detail=reason, fix=fix)
    m = files.manifest
    return BackendStatus(
        name="microvm",
        usable=True,
        detail=f"{found.version_text}; guest kernel {m.kernel_release}; image "
        f"{m.image_sha256[:12]} built {m.built_at}; jailer: "
        + ("bubblewrap" if jail.plan_jail() else jail.why_not()),
        fix=None,
    )


def sweep() -> list[str]:
    """Remove what dead supervisors left: QEMU processes, run directories, snapshots."""
    removed: list[str] = []
    for root in (layout.runs_root(), layout.snapshots_root()):
        if not root.is_dir():
            continue
        for entry in root.iterdir():
            if entry.name.startswith("cache-"):
                continue  # shared snapshots, kept for reuse (``sandcell vm build`` renews them)
            owner = entry.name
            if root == layout.snapshots_root():
                owner = entry.name.partition("-")[2].rsplit("-", 1)[0]
            if layout.owner_alive(owner):
                continue
            _kill_qemus_under(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
    # The jails' cgroups are named like the namespaces backend's (owner tag first): its sweep
    # kills and removes those of dead supervisors.
    removed += host_sweep()
    return removed


def sweep_stale() -> list[str]:
    """:func:`sweep` without a backend (the registry's, for ``sandcell session``): what the
    microVMs of dead supervisors left (a microVM session's server killed by SIGKILL); nothing
    when no microVM ever ran here."""
    if not layout.runs_root().is_dir() and not layout.snapshots_root().is_dir():
        return []
    return sweep()


def _kill_qemus_under(path: Path) -> None:
    """Kill QEMU processes whose command line names a file under ``path``."""
    for pid in snapshot.qemus_naming(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0)


__all__ = ["MicroVMBackend", "WarmConfig", "probe", "sweep", "sweep_stale"]
