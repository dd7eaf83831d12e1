"""Warm starts for the microVM backend: runs start from a snapshot instead of a boot.

:class:`WarmVMs` takes the snapshot on a background thread when the backend starts (a boot with
the preload imported, saved: ``snapshot.py``). ``mode="template"`` restores a clone for each run
at call time; ``mode="pool"`` keeps ``pool_size`` clones restored ahead, through the handshake
and then paused (an idle TCG guest would cost several percent of a host CPU each), and resumes
one per run. Every clone serves exactly one run and is destroyed after it; the job it receives
carries fresh entropy, the wall clock and a new hostname (see ``guest/job.py``). While a run holds
the refill (:meth:`WarmVMs.refill_held`) and a clone is still ready, the next one is restored
after that run's result, not during it: on a host with few cores a restore (QEMU's start, the
guest's warm-up) would take the CPU the run's guest needs.

Closing aborts a clone being restored: its QEMU is killed as soon as it runs (the restore then
fails at once and removes what it made), so ``close`` never waits for a warm-up whose clone
nobody will take. With ``WarmConfig(refill=False)`` (a process that runs one program) the pool
is filled once and a taken clone is not replaced; its clones are neither warmed up nor paused,
since the run takes them as soon as they answer (measured with ``sandcell run --start pool``:
about 1.3 s instead of 1.75 s a run on the development VM).

The snapshot is shared by this user's processes (``snapshot.cached``): a CLI run with
``--start pool`` restores from the one an earlier process saved instead of booting again.

The snapshot is of one runtime's image (``WarmConfig.runtime``; the guest the backend hands in):
its preload keeps only the names that runtime can import (``minimal`` has no numpy), and the
snapshot's cache key and checks name that image, so a snapshot of one runtime's image is never
restored for another's.

What the snapshot cannot serve starts cold, and the record says why: a run in another runtime, a
memory limit above the snapshot's guest size, or any run while the snapshot is not (yet, or any
more) available.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator

from sandcell.backends.host.warm_runtime import importable_preload
from sandcell.backends.microvm import channel, machine, snapshot
from sandcell.backends.microvm.vm import VM
from sandcell.backends.warm import PoolStats, WarmConfig, WarmStats, idle_memory
from sandcell.errors import InfraError
from sandcell.spec import DEFAULT_RUNTIME, Limits, RunRequest, StartInfo

SNAPSHOT_MEMORY_BYTES = Limits().memory_bytes
"""The program memory a snapshot's guest is sized for (the default limit); smaller limits are
set inside the guest, larger ones start cold."""
_REFILL_PAUSE_S = 1.0


def runtime_of(name: str | None) -> str:
    """A runtime name as pools compare them (None is ``default``)."""
    return name or DEFAULT_RUNTIME


class WarmVMs:
    """The snapshot and, in pool mode, the clones waiting for a run (see module)."""

    def __init__(self, guest: machine.Guest, config: WarmConfig) -> None:
        self.guest = guest
        """The guest of :attr:`runtime`'s image."""
        self.config = config
        self.runtime = runtime_of(config.runtime)
        self.preload = importable_preload(config.preload, config.runtime)
        self.memory_mib = machine.guest_mib(SNAPSHOT_MEMORY_BYTES)
        self.snapshot: snapshot.Snapshot | None = None
        self.error: str | None = None
        self._cond = threading.Condition()
        self._ready: collections.deque[VM] = collections.deque()
        self._closed = False
        self._snapshot_done = False
        self._restored = self._taken = self._discarded = self._errors = 0
        self._runs = self._fallbacks = 0
        self._holds = 0
        self._preparing: VM | None = None
        """The clone being restored, killed by :meth:`close` (guarded by ``_cond``)."""
        self._thread = threading.Thread(target=self._work, name="sandcell-vm-pool", daemon=True)
        self._thread.start()

    # -- background ------------------------------------------------------------------------

    def _work(self) -> None:
        try:
            snap = snapshot.cached(
                self.guest,
                memory_mib=self.memory_mib,
                preload=self.preload,
                timeout_s=self.config.start_timeout_s,
            )
        except (InfraError, OSError) as exc:
            with self._cond:
                self.error = f"the snapshot could not be taken: {exc}"
                self._snapshot_done = True
                self._cond.notify_all()
            return
        with self._cond:
            self.snapshot = snap
            self._snapshot_done = True
            self._cond.notify_all()
            if self._closed:
                return
        if self.config.mode == "pool":
            self._fill(snap)

    def _fill(self, snap: snapshot.Snapshot) -> None:
        while True:
            with self._cond:
                # Filled once without refill, the thread stays (idle) until close: the jail
                # kills QEMU when the thread that started it ends (``--die-with-parent``).
                while not self._closed and (
                    len(self._ready) >= self.config.pool_size
                    or (self._holds and self._ready)
                    or self._filled_once()
                ):
                    self._cond.wait()
                if self._closed:
                    return
            try:
                vm = snapshot.restore(self.guest, snap, name="pool", started=self._started)
                try:
                    if self.config.refill:
                        _warm(vm)
                        assert vm.qmp is not None
                        vm.qmp.execute("stop", deadline=time.monotonic() + 10)
                    # else its one clone is taken at once: a warm-up would only delay the run
                except BaseException:
                    self._prepared()
                    vm.destroy()
                    raise
            except (InfraError, OSError) as exc:
                with self._cond:
                    self._preparing = None
                    if self._closed:
                        return
                    self._errors += 1
                    self.error = f"a clone could not be restored: {exc}"
                    self._cond.wait(_REFILL_PAUSE_S)
                continue
            with self._cond:
                self._preparing = None
                if not self._closed:
                    self._restored += 1
                    self._ready.append(vm)
                    self._cond.notify_all()
                    continue
            vm.destroy()
            return

    def _filled_once(self) -> bool:
        """With ``refill=False``: every clone the pool will ever have was restored (lock held)."""
        return not self.config.refill and self._restored >= self.config.pool_size

    def _started(self, vm: VM) -> None:
        """QEMU of the clone being restored runs: :meth:`close` may kill it from now on."""
        with self._cond:
            self._preparing = vm
            if self._closed:
                vm.kill(reap=False)

    def _prepared(self) -> None:
        # Under the lock, so close() never signals a QEMU this thread has already reaped.
        with self._cond:
            self._preparing = None

    # -- runs ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def refill_held(self) -> Iterator[None]:
        """No clone is restored while this block runs, unless none is ready (see module)."""
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    def _wait_snapshot(self, deadline: float) -> snapshot.Snapshot | str:
        with self._cond:
            while not self._snapshot_done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "the snapshot is still being taken"
                self._cond.wait(left)
            if self.snapshot is None:
                return self.error or "no snapshot"
            return self.snapshot

    def take(self, request: RunRequest) -> tuple[VM, StartInfo] | str:
        """A ready VM for ``request`` and how it started, or why it must start cold."""
        t0 = time.monotonic()
        if runtime_of(request.runtime) != self.runtime:
            self._fallbacks += 1
            return (
                f"the warm VMs are of runtime {self.runtime}'s image, the run's runtime is "
                f"{runtime_of(request.runtime)}"
            )
        if request.effective_limits.memory_bytes > SNAPSHOT_MEMORY_BYTES:
            self._fallbacks += 1
            return f"the memory limit is above the snapshot's {SNAPSHOT_MEMORY_BYTES} bytes"
        deadline = t0 + self.config.take_timeout_s
        snap = self._wait_snapshot(deadline)
        if isinstance(snap, str):
            self._fallbacks += 1
            return snap
        if self.config.mode == "template":
            try:
                vm = snapshot.restore(self.guest, snap, name="clone")
            except (InfraError, OSError) as exc:
                self._fallbacks += 1
                return f"the snapshot could not be restored: {exc}"
            mode = "template"
        else:
            got = self._pop(deadline)
            if got is None:
                self._fallbacks += 1
                return "no pooled VM was ready in time"
            vm = got
            mode = "pool"
            try:
                assert vm.qmp is not None
                vm.qmp.execute("cont", deadline=time.monotonic() + 10)
            except (InfraError, OSError) as exc:
                vm.destroy()
                self._fallbacks += 1
                return f"the pooled VM could not be resumed: {exc}"
        self._runs += 1
        info = StartInfo(
            mode=mode,  # type: ignore[arg-type]
            template=f"vm-snapshot-{snap.id}",
            preloaded=snap.preload,
            wait_ms=round((time.monotonic() - t0) * 1000, 3),
        )
        return vm, info

    def _pop(self, deadline: float) -> VM | None:
        with self._cond:
            while True:
                while self._ready:
                    vm = self._ready.popleft()
                    self._cond.notify_all()
                    if vm.alive():
                        self._taken += 1
                        return vm
                    self._discarded += 1
                    vm.destroy()
                left = deadline - time.monotonic()
                if left <= 0 or self._closed or self._filled_once():
                    return None
                self._cond.wait(left)

    def stats(self) -> WarmStats:
        with self._cond:
            ready = list(self._ready)
            pss, uss = idle_memory(tuple(p for vm in ready for p in vm.pids())) if ready else (0, 0)
            pool = (
                PoolStats(
                    size=self.config.pool_size,
                    ready=len(ready),
                    forked=self._restored,
                    taken=self._taken,
                    discarded=self._discarded,
                    refill_errors=self._errors,
                    last_error=self.error,
                    idle_pss_bytes=pss,
                    idle_uss_bytes=uss,
                )
                if self.config.mode == "pool"
                else None
            )
            snap = self.snapshot
            return WarmStats(
                mode=self.config.mode,
                template_id=f"vm-snapshot-{snap.id}" if snap else None,
                template_pid=None,
                template_state={
                    "snapshot_dir": str(snap.dir) if snap else None,
                    "guest_memory_mib": self.memory_mib,
                    "preload": list(self.preload),
                    "runtime": self.runtime,
                    "error": self.error,
                },
                template_pss_bytes=0,
                template_restarts=0,
                runs=self._runs,
                fallbacks=self._fallbacks,
                pool=pool,
                cgroup_prefix="",
            )

    def close(self) -> None:
        """Destroy the waiting clones and kill the one being restored (see module); waits for
        the background thread, which then only removes that clone's files."""
        with self._cond:
            self._closed = True
            ready = list(self._ready)
            self._ready.clear()
            if self._preparing is not None:
                # Not reaped here: the refill thread's restore fails on the dead QEMU and
                # destroys the clone itself.
                self._preparing.kill(reap=False)
            self._cond.notify_all()
        for vm in ready:
            vm.destroy()
        # The snapshot itself stays: it is shared with this user's other processes.
        self._thread.join(timeout=self.config.start_timeout_s + 30)


def _warm(vm: VM) -> None:
    """Have the restored guest run a program's code paths once before it waits (``P``)."""
    assert vm.chan is not None
    deadline = time.monotonic() + 30
    try:
        vm.chan.send(channel.WARM)
        kind, _ = vm.chan.recv(deadline)
    except channel.ChannelError as exc:
        raise InfraError(f"the restored guest did not warm up: {exc}") from None
    if kind != channel.WARMED:
        raise InfraError(f"the restored guest answered {kind!r} to the warm-up")


__all__ = ["SNAPSHOT_MEMORY_BYTES", "WarmVMs", "runtime_of"]
