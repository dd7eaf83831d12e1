"""Warm starts for gVisor: a pool of sandboxes started ahead of time, each used once.

A pooled sandbox is a complete cold sandbox (bundle, workspace tmpfs, cgroup, ``runsc run``)
whose agent has imported the preload (trusted runtime code) and waits on stdin; it has never
seen a request. A run takes one, sizes its cgroup and workspace to the request, writes the
program and its plan into the control directory, sends the request, and supervises it exactly
as a cold run (the sandbox is then destroyed; a refill thread starts the next one). What a
pooled sandbox cannot serve starts cold, and the record says why: inputs and packages (mounts
are fixed when runsc starts), another ``/tmp`` size, another isolation mode than the pool's,
an rlimit above the pool's ceilings, a workspace size other than the default for an ordinary
user (the helper sized it), a runtime other than the pool's (its sandboxes mount and preload
``WarmConfig.runtime``), or no pooled sandbox within ``take_timeout_s``. Preload names the
pool's runtime cannot import are left out (``minimal`` has no numpy): the pool still starts.

A run that reaches outside (an egress allowlist, tools) is served too: every pooled sandbox is
started with an empty socket view bound at ``/.sandcell`` (``/run`` a link to its ``run``,
which leads nowhere: a run that does not reach outside has no ``/run``, as in a cold sandbox)
and runsc's connect-only host socket setting; taking it, such a run makes ``run/sandcell`` in
the view with links to its sockets and client files (``GSandbox.attach_sockets``), and the
agent starts the egress bridge before the program.

The CPU time the agent spent on its preload is not charged to the program: the cgroup's usage
at take time is the baseline of the CPU-time limit and of the reported usage.

Security limitations: a pooled sandbox's ``/tmp`` and memory already hold what the preload
imported; the program can see which modules were loaded (as with the namespaces template).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import uuid
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.backends.gvisor import proctree
from sandcell.backends.gvisor._agent import READY
from sandcell.backends.gvisor.plan import POOL_CEILINGS, plan_rlimits
from sandcell.backends.gvisor.sandbox import GSandbox, Host, fixed_for_pool
from sandcell.backends.host.warm_runtime import (
    importable_preload,
    runtime_mismatch,
    runtime_name,
)
from sandcell.backends.warm import SandboxPoolStats, WarmConfig
from sandcell.errors import SandcellError
from sandcell.run_sockets import SandboxSockets
from sandcell.runtimes import python_runtime
from sandcell.spec import NODE_LANGUAGES, IsolationMode, Limits, RunRequest, StartInfo

if TYPE_CHECKING:
    from sandcell.backends.gvisor import GVisorBackend

_READ_CHUNK = 65536


class GVisorPool:
    """The pool of one :class:`~sandcell.backends.gvisor.GVisorBackend` (see the module)."""

    def __init__(self, backend: GVisorBackend, config: WarmConfig) -> None:
        self.backend = backend
        self.runtime = runtime_name(config.runtime)
        # A missing or tampered runtime is refused here, not by every refill in the background.
        python_runtime(self.runtime)
        self.config = replace(config, preload=importable_preload(config.preload, self.runtime))
        self.mode = (
            IsolationMode.STRICT
            if IsolationMode.STRICT in backend._hosts
            else IsolationMode.RLIMITS
        )
        self.host: Host = backend._hosts[self.mode]
        self.id = f"gvisor-pool-{uuid.uuid4().hex[:8]}"
        self._ready: deque[GSandbox] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._started = self._taken = self._discarded = self._errors = 0
        self._last_error: str | None = None
        self._filling = 0
        self._thread = threading.Thread(target=self._refill, name=self.id, daemon=True)
        self._thread.start()

    # -- taking ----------------------------------------------------------------------------

    def mismatch(self, request: RunRequest, sockets: SandboxSockets | None = None) -> str | None:
        """Why a pooled sandbox cannot serve ``request`` (None when it can)."""
        limits = request.effective_limits
        default = Limits()
        if sockets is not None and not self.host.runsc.host_uds:
            return "this runsc cannot connect to host sockets (no --host-uds)"
        if request.mode is not self.mode:
            return f"the pool runs in the {self.mode.value} isolation mode"
        if request.language in NODE_LANGUAGES:
            return (
                f"{request.language} programs start cold (the pooled sandboxes mount the Python "
                "runtime, not Node's)"
            )
        other_runtime = runtime_mismatch(request, self.runtime, "pool")
        if other_runtime is not None:
            return other_runtime
        if request.inputs or request.packages:
            return "inputs and packages are mounts, fixed when a pooled sandbox starts"
        if request.landlock is True:
            return "Landlock is required"
        if limits.tmp_bytes != default.tmp_bytes:
            return "a /tmp size other than the pool's"
        if self.host.runsc.rootless and (
            limits.workspace_bytes != default.workspace_bytes
            or limits.workspace_inodes != default.workspace_inodes
        ):
            return "a workspace size other than the pool's (rootless: fixed when it starts)"
        for r in plan_rlimits(limits, request.mode):
            if r.value > POOL_CEILINGS.get(r.name, r.value):
                return f"{r.name} above the pool's ceiling"
        return None

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult | str:
        """Run ``request`` in a pooled sandbox, or say why it cannot (the caller starts cold).
        ``sockets``: the run's ways out, shown in the sandbox's socket view as it is taken."""
        why = self.mismatch(request, sockets)
        if why is not None:
            return why
        t_wait = time.monotonic()
        sb = self._take()
        if sb is None:
            return f"no pooled sandbox ready within {self.config.take_timeout_s:g} s"
        wait_ms = (time.monotonic() - t_wait) * 1000
        try:
            assert sb.proc is not None
            baseline = (
                sb.cgroup.usage().cpu_ms
                if sb.cgroup is not None
                else proctree.tree_cpu_ms(sb.proc.pid)
            )
            try:
                if sockets is not None:
                    sb.attach_sockets(sockets)
                sb.deliver(request, sockets)
            except (OSError, SandcellError) as exc:
                return f"the pooled sandbox could not take the request: {exc}"
            t0 = time.monotonic()
            start = StartInfo(
                mode="pool", template=self.id, preloaded=self.config.preload, wait_ms=wait_ms
            )
            return self.backend.finish(
                sb,
                request,
                run_id=run_id,
                collect=collect,
                t0=t0,
                start=start,
                cpu_baseline_ms=baseline or 0.0,
                sockets=sockets,
                on_output=on_output,
            )
        finally:
            sb.destroy()

    def _take(self) -> GSandbox | None:
        deadline = time.monotonic() + self.config.take_timeout_s
        with self._cond:
            while True:
                while self._ready:
                    sb = self._ready.popleft()
                    self._cond.notify_all()
                    if sb.proc is not None and sb.proc.poll() is None:
                        self._taken += 1
                        return sb
                    self._discarded += 1
                    threading.Thread(target=sb.destroy, daemon=True).start()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed or self._filled_once():
                    return None
                self._cond.wait(remaining)

    def _filled_once(self) -> bool:
        """With ``refill=False``: every sandbox the pool will ever have was started (lock held)."""
        return not self.config.refill and self._started >= self.config.pool_size

    # -- filling ---------------------------------------------------------------------------

    def _refill(self) -> None:
        while True:
            with self._cond:
                # Filled once without refill, the thread waits idle for close rather than end:
                # what it started may be tied to it (a parent-death signal is per thread).
                while not self._closed and (
                    len(self._ready) >= self.config.pool_size or self._filled_once()
                ):
                    self._cond.wait()
                if self._closed:
                    return
                self._filling += 1
            sb: GSandbox | None = None
            try:
                sb = self._start_one()
            except Exception as exc:  # a failed start is counted and retried after a pause
                with self._cond:
                    self._errors += 1
                    self._last_error = f"{type(exc).__name__}: {exc}"
                time.sleep(min(0.5 * self._errors, 10.0))
            with self._cond:
                self._filling -= 1
                if sb is not None and not self._closed:
                    self._ready.append(sb)
                    self._started += 1
                    self._cond.notify_all()
                    sb = None
            if sb is not None:
                sb.destroy()

    def _start_one(self) -> GSandbox:
        name = self.backend.new_name(f"pool-{self.id}")
        sb = GSandbox(self.host, name=name, fixed=fixed_for_pool(self.host, self.runtime))
        try:
            sb.create(self.config.preload)
            sb.spawn()
            self._await_ready(sb)
        except BaseException:
            sb.destroy()
            raise
        return sb

    def _await_ready(self, sb: GSandbox) -> None:
        assert sb.proc is not None and sb.proc.stderr is not None
        fd = sb.proc.stderr.fileno()
        deadline = time.monotonic() + self.config.start_timeout_s
        seen = b""
        while READY not in seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                raise TimeoutError("the pooled sandbox's agent did not become ready")
            if select.select([fd], [], [], min(remaining, 0.5))[0]:
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    raise RuntimeError(
                        "the pooled sandbox ended before it was ready: "
                        + seen.decode(errors="replace").strip()[-500:]
                    )
                seen = (seen + chunk)[-_READ_CHUNK:]

    # -- state -----------------------------------------------------------------------------

    def stats(self) -> SandboxPoolStats:
        with self._cond:
            ready = list(self._ready)
            counts = (self._started, self._taken, self._discarded, self._errors)
            last = self._last_error
        idle = 0
        for sb in ready:
            if sb.cgroup is not None:
                with contextlib.suppress(OSError, ValueError):
                    idle += int((sb.cgroup.dirs[_mem_controller(sb)] / _mem_file(sb)).read_text())
        return SandboxPoolStats(
            mode="pool",
            template_id=self.id,
            preload=self.config.preload,
            size=self.config.pool_size,
            ready=len(ready),
            started=counts[0],
            taken=counts[1],
            discarded=counts[2],
            refill_errors=counts[3],
            last_error=last,
            idle_memory_bytes=idle,
            runtime=self.runtime,
        )

    def close(self) -> None:
        """Stop refilling and destroy every waiting sandbox."""
        with self._cond:
            self._closed = True
            ready = list(self._ready)
            self._ready.clear()
            self._discarded += len(ready)
            self._cond.notify_all()
        self._thread.join(timeout=self.config.start_timeout_s + 5)
        for sb in ready:
            sb.destroy()


def _mem_controller(sb: GSandbox) -> str:
    assert sb.cgroup is not None
    return "unified" if sb.cgroup.host.version == 2 else "memory"


def _mem_file(sb: GSandbox) -> str:
    assert sb.cgroup is not None
    return "memory.current" if sb.cgroup.host.version == 2 else "memory.usage_in_bytes"


__all__ = ["GVisorPool"]
