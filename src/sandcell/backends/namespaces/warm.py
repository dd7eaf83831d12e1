"""Warm starts that stay one sandbox per run: the template fast path and the warm pool.

``NamespacesBackend(warm=WarmConfig(mode="template"))`` starts each python run from a template
process that imported the configured modules once and never runs untrusted code (``_zygote.py``,
``template.py``): the run's own child isolates itself as a fresh sandbox would be (namespaces,
``/proc``, tmpfs workspace and ``/tmp``, inputs read-only, rlimits, no capabilities,
no_new_privs, Landlock, the cold path's full seccomp filter) before the request reaches it, and
the host puts it in the run's cgroup first. ``mode="pool"`` forks those children ahead of time
(``pool.py``); a run takes one, uses it once, and it is destroyed.

A pooled child is prepared completely before it is taken (``_arm``): its cgroup is created with
the limits of the last run served and its pid 1 attached, and its program process is forked and
restricted (capabilities, no_new_privs, Landlock, seccomp), waiting for the code. At take the
host only rewrites a cgroup limit that differs, sends the request, and pid 1 mounts the inputs,
sizes the tmpfs, sets the rlimits, drops its own privileges and hands over. A run that needs
layers a prepared child does not have (Landlock off, the ``rlimits`` mode next to a cgroup pool)
gets a child forked for it at call time (recorded as ``template``). The result is returned as
soon as status, output, usage and exports are in; the sandbox (pid 1, its namespaces, its
cgroup) is destroyed on a background thread (``warm_teardown.py``, bounded backlog; ``close``
waits for it). Where the run's cgroup can be frozen (the v1 freezer controller, or v2's
``cgroup.freeze``), the program's end is reported before its process exits and the result is
read from the frozen sandbox (``_zygote.py`` step 6, ``warm_drive.py``): the exports still come
from a workspace where nothing of the run can move, and the exit itself is part of the
teardown. Runs are registered with the backend's run registry, so ``cancel_all`` stops them.

A run that reaches outside (``sockets``) starts warm too: its socket directory travels with
the request as one more detached mount tree, and pid 1 starts the egress bridge before it hands
over to the program (``outside.py``, ``_zygote_init.py``).

The request a child is sent and its input trees: ``warm_request.py``; the run itself (output
under the limits, status, exports), with measured timings and where a pooled run's time goes:
``warm_drive.py``. Refilling costs three forks of the template image per sandbox (template ->
C -> G -> P) plus a cgroup attach, which caps back-to-back throughput at about 35-40 runs/s
on the 2-core development host.

JavaScript and TypeScript runs take a sandbox with Node waiting from a pool of their own in the
``pool`` mode (``node_pool.py``), filled from the first such run on.

What the cold path still serves (and the record says why, in the enforcement layer
``warm_start``): bash, JavaScript and TypeScript in the ``template`` mode, packages from the
wheel cache, a run in another runtime than the template's (``WarmConfig.runtime``,
``warm_runtime.py``), and any run while the template is down.
Rich outputs (``display``) start warm: the template loads the display module once. The outcome
of a warm run is classified exactly as a cold one's.

Security limitations: see ``_zygote.py`` (shared pre-fork memory image, hash secret, address-space
layout) and ``template.py``. ``/dev`` is read-only and has no ``/dev/pts``. In the ``rlimits``
mode the address-space limit counts from what the template already maps, not from zero. BLAS and
OpenMP pools are single-threaded (set before the template's imports).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sandcell.backends.base import BackendResult, Collector, OutputSink
from sandcell.backends.host import cgroups, landlock, seccomp, workspace
from sandcell.backends.host.layout import SANDBOX_WORKDIR
from sandcell.backends.host.observe import observed
from sandcell.backends.host.process import StopPipe
from sandcell.backends.host.runtime_mounts import support_files
from sandcell.backends.host.warm_runtime import (
    importable_preload,
    runtime_changed,
    runtime_mismatch,
    runtime_stamp,
)
from sandcell.backends.namespaces.pool import WarmPool
from sandcell.backends.namespaces.template import (
    Armed,
    Template,
    WarmChild,
    compile_zygote,
    recv_message,
    send_message,
)
from sandcell.backends.namespaces.warm_drive import drive
from sandcell.backends.namespaces.warm_limits import PoolLimits
from sandcell.backends.namespaces.warm_request import (
    LandlockPlans,
    for_armed,
    input_trees,
    request_doc,
)
from sandcell.backends.namespaces.warm_teardown import Teardown, destroyer
from sandcell.backends.warm import WarmConfig, WarmStats, idle_memory
from sandcell.errors import InfraError, IsolationUnavailable
from sandcell.run_sockets import PROXY_PORT, SandboxSockets
from sandcell.runtimes import common_env, runtime_for
from sandcell.spec import NODE_LANGUAGES, RunRequest, StartInfo

if TYPE_CHECKING:
    from sandcell.backends.namespaces import NamespacesBackend
    from sandcell.backends.namespaces.node_pool import NodePool

__all__ = ["WarmConfig", "WarmStarter", "WarmStats"]


class WarmStarter:
    """The warm-start half of :class:`NamespacesBackend` (one per backend)."""

    def __init__(self, backend: NamespacesBackend, config: WarmConfig) -> None:
        self.backend = backend
        self.config = config
        # One runtime per template: runs in another start cold (``unservable``), and so do
        # runs once the store no longer holds the build it was made from.
        self._stamp = runtime_stamp(config.runtime)
        self.runtime = runtime_for("python", config.runtime)
        self.preload = importable_preload(config.preload, config.runtime)
        """What the template imports: ``config.preload`` less what the runtime lacks."""
        self._zygote_files = compile_zygote()
        self._setup_seccomp = seccomp.build_setup_policy(backend.arch).compile()
        self._display_code = landlock.boot_bytecode(
            f"{landlock.SANDBOX_DIR}/display.py", script=landlock.DISPLAY_SCRIPT
        )
        host = backend._cgroup_host
        self._cgroup_host = host if isinstance(host, cgroups.CgroupHost) else None
        self._landlock_abi = backend._landlock_abi
        self._pool_limits = PoolLimits(self._cgroup_host)
        self._landlock_plans = LandlockPlans(self.runtime)
        self._env = {**common_env(), **self.runtime.sandbox_env}
        self._teardown = Teardown()
        self.cgroup_prefix = f"{workspace.owner_tag()}.w{uuid.uuid4().hex[:8]}-"
        self._lock = threading.Lock()
        self._template: Template | None = None
        self._pool: WarmPool | None = None
        self._restarts = -1
        self._runs = self._fallbacks = 0
        # JavaScript and TypeScript: sandboxes with Node waiting (``node_pool.py``), filled from
        # the first such run on; not for a process that runs one program (``refill`` off).
        self._node_pool: NodePool | None = None
        if config.mode == "pool" and config.refill:
            from sandcell.backends.namespaces.node_pool import NodePool  # imports the backend

            self._node_pool = NodePool(backend, config)
        self._start()

    # -- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        """Start a template (and pool); its imports run while this returns."""
        self._restarts += 1
        run_dir = self.backend.root / workspace.owner_tag() / f"warm-{uuid.uuid4().hex[:12]}"
        template = Template(
            bwrap=self.backend.bwrap.path,
            runtime=self.runtime,
            run_dir=run_dir,
            etc_dir=self.backend.root / "etc",
            runtime_files=support_files(self.backend.root, self.runtime),
            boot_code=self.backend.boot_code,
            zygote_files=self._zygote_files,
            display_code=self._display_code,
            setup_seccomp=self._setup_seccomp,
            run_seccomp=self.backend.seccomp_program,
            preload=self.preload,
        )
        self._template = template
        if self.config.mode == "pool":
            self._pool = WarmPool(lambda: self._fork(template), self.config.pool_size)

    def _fork(self, template: Template) -> WarmChild:
        template.wait_ready(self.config.start_timeout_s)
        return self._arm(template.fork())

    def _arm(self, child: WarmChild) -> WarmChild:
        """Prepare a pooled child before any request: its cgroup joined (with the limits runs
        have been asking for), its program process forked and restricted, waiting."""
        memory_bytes, max_pids = self._pool_limits.fill
        cgroup: cgroups.RunCgroup | None = None
        try:
            if self._cgroup_host is not None:
                name = f"{self.cgroup_prefix}{uuid.uuid4().hex[:12]}"
                cgroup = cgroups.RunCgroup(self._cgroup_host, name, freezer=True)
                cgroup.create(self._pool_limits.settings(self._cgroup_host, memory_bytes, max_pids))
                cgroup.attach(child.init_pid)
            # Before the run's profile is known: the bridge's port reachable (warm_request.py).
            plan = self._landlock_plans.for_abi(self._landlock_abi, egress=True)
            arm = {"arm": {"landlock": plan}}
            send_message(child.sock, json.dumps(arm).encode())
            msg, _ = recv_message(child.sock, time.monotonic() + self.config.start_timeout_s)
            if msg != b"P":
                raise InfraError(f"the pooled sandbox failed to prepare: {msg[:200]!r}")
            usage = cgroup.usage() if cgroup is not None else None
        except (OSError, InfraError, IsolationUnavailable) as exc:
            child.discard()
            if cgroup is not None:
                cgroup.kill_all()
                cgroup.remove()
            raise InfraError(f"could not prepare a pooled sandbox: {exc}") from exc
        armed = Armed(
            cgroup=cgroup,
            landlock_abi=self._landlock_abi,
            memory_bytes=memory_bytes,
            max_pids=max_pids,
            cpu_base_ms=usage.cpu_ms if usage is not None and usage.cpu_ms is not None else 0.0,
        )
        return replace(child, armed=armed)

    def _fits(self, layers: Any) -> bool:
        """Whether a pooled (prepared) child gives this run exactly its layers."""
        return (layers.cgroup_host is not None) == (
            self._cgroup_host is not None
        ) and layers.landlock_abi == self._landlock_abi

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._template is not None:
            self._template.close()
            workspace.remove_tree(self._template.run_dir)
            self._template = None

    def close(self) -> None:
        """End the template and pool; returns once every used sandbox is torn down."""
        with self._lock:
            self._stop()
            if self._node_pool is not None:
                self._node_pool.close()
                self._node_pool = None
        self._teardown.drain()

    def template(self) -> Template:
        """The live template, restarted if it died; waits for its preload."""
        with self._lock:
            if self._template is None or (
                self._template.pid is not None and not self._template.alive()
            ):
                self._stop()
                self._start()
            template = self._template
            assert template is not None
        template.wait_ready(self.config.start_timeout_s)
        return template

    def stats(self) -> WarmStats:
        """The template and pool now (waits for a starting template's preload)."""
        template = self._template
        if template is not None and template.alive():
            with contextlib.suppress(InfraError):
                template.wait_ready(self.config.start_timeout_s)
        state: Mapping[str, Any] = {}
        pss = 0
        pid = template.pid if template is not None else None
        if template is not None and template.alive() and pid is not None:
            with contextlib.suppress(InfraError, OSError):
                state = template.query_state()
            pss = idle_memory((pid,))[0]
        return WarmStats(
            mode=self.config.mode,
            template_id=template.id if template is not None else None,
            template_pid=pid,
            template_state=state,
            template_pss_bytes=pss,
            template_restarts=self._restarts,
            runs=self._runs,
            fallbacks=self._fallbacks,
            pool=self._pool.stats() if self._pool is not None else None,
            cgroup_prefix=self.cgroup_prefix,
            node_pool=self._node_pool.stats() if self._node_pool is not None else None,
        )

    # -- serving a run ---------------------------------------------------------------------

    def unservable(self, request: RunRequest) -> str | None:
        """Why this request starts cold, or None when a warm start can serve it."""
        if request.language in NODE_LANGUAGES and self.config.mode == "pool":
            return (
                f"{request.language} programs start cold when the pool is filled once "
                "(WarmConfig.refill off): Node waits only in a refilled pool"
            )
        if request.language in NODE_LANGUAGES:
            return (
                f"{request.language} programs start cold (the template is a python interpreter; "
                "Node waits ready in the pool mode, WarmConfig(mode='pool'))"
            )
        if request.language != "python":
            return f"{request.language} programs start cold (the template is a python interpreter)"
        if request.packages:
            return "runs with packages from the wheel cache start cold"
        return runtime_mismatch(request, self.config.runtime, self.config.mode) or runtime_changed(
            self._stamp, self.config.mode
        )

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult | str:
        """The run's result, or why it must start cold instead (nothing ran then). ``sockets``:
        the run's ways out, moved into its sandbox as a mount tree (``outside.py``);
        ``on_output``: told the output as it is read."""
        if request.language in NODE_LANGUAGES and self._node_pool is not None:
            node = self._node_pool.run(
                request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
            )
            if isinstance(node, str):
                self._fallbacks += 1
            else:
                self._runs += 1
            return node
        reason = self.unservable(request)
        if reason is not None:
            self._fallbacks += 1
            return reason
        layers = self.backend.decide(request)  # fails closed as a cold start would
        try:
            scratch = self.backend.root / workspace.owner_tag()
            scratch.mkdir(mode=0o700, exist_ok=True)
            trees = input_trees(
                request,
                scratch,
                self.backend.root / "etc" / ".empty",
                plain=[sockets.host_dir] if sockets is not None else [],
            )
        except (OSError, InfraError) as exc:
            self._fallbacks += 1
            what = "inputs or sockets" if sockets is not None else "inputs"
            return f"{what} could not be prepared for a warm start: {exc}"
        try:
            t0 = time.monotonic()
            # A pooled child is prepared for the common layers; a run that asks for others
            # (Landlock off, the rlimits mode) gets a child forked for it now.
            pooled = self._pool is not None and self._fits(layers)
            try:
                template = self.template()
                if pooled:
                    assert self._pool is not None
                    child, wait_ms = self._pool.take(self.config.take_timeout_s)
                else:
                    child = template.fork()
                    wait_ms = (time.monotonic() - t0) * 1000
            except InfraError as exc:
                self._fallbacks += 1
                return f"no warm sandbox: {exc}"
            self._runs += 1
            # From here the child is used: whatever fails is this run's infra_error, never an
            # unisolated run and never a second start.
            start = StartInfo(
                mode="pool" if pooled else "template",
                template=template.id,
                preloaded=self.preload,
                wait_ms=round(wait_ms, 3),
            )
            return self._serve(
                request,
                child=child,
                trees=trees,
                layers=layers,
                start=start,
                run_id=run_id,
                collect=collect,
                sockets=sockets,
                on_output=on_output,
            )
        finally:
            for fd in trees:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _serve(
        self,
        request: RunRequest,
        *,
        child: WarmChild,
        trees: list[int],
        layers: Any,
        start: StartInfo,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        limits = request.effective_limits
        armed = child.armed
        cgroup: cgroups.RunCgroup | None = None
        pool = self._pool
        if pool is not None:
            pool.run_started()
        try:
            if armed is not None:
                cgroup = armed.cgroup
                if cgroup is not None:
                    self._pool_limits.retune(cgroup, armed, limits)
            elif layers.cgroup_host is not None:
                cgroup = cgroups.RunCgroup(
                    layers.cgroup_host, f"{workspace.owner_tag()}.{run_id}", freezer=True
                )
                cgroup.create(
                    cgroups.plan_settings(
                        layers.cgroup_host.version,
                        memory_bytes=limits.memory_bytes,
                        max_pids=limits.max_pids,
                        swap_accounting=cgroups.swap_accounting(layers.cgroup_host),
                    )
                )
                try:
                    cgroup.attach(child.init_pid)
                except OSError as exc:
                    raise InfraError(
                        f"could not move the warm sandbox into its cgroup: {exc}"
                    ) from exc
            doc = request_doc(
                request,
                env=self._env,
                # Used by a child forked now. A pooled one was restricted when it was armed and
                # is not sent it: more than half of the document, for pid 1 to parse for nothing.
                landlock_plan=None
                if armed is not None
                else self._landlock_plans.for_abi(layers.landlock_abi, egress=sockets is not None),
                sockets=sockets,
            )
            quiesce = _quiescer(cgroup) if cgroup is not None and cgroup.can_freeze else None
            if quiesce is not None:
                doc["quiesce"] = True
            if armed is not None:
                doc = for_armed(doc)
            stop = StopPipe()
            try:
                # Cancellable as a cold run is: the stop ends it as its wall limit would.
                with self.backend.runs.register(run_id, stop.set) as cancellation:
                    launched, artifacts, rejected = drive(
                        child,
                        doc,
                        request,
                        trees,
                        collect,
                        stop_fd=stop.r,
                        quiesce=quiesce,
                        on_output=on_output,
                    )
            finally:
                stop.close()
            cg_usage = cgroup.usage() if cgroup is not None else None
            if cg_usage is not None and cg_usage.cpu_ms is not None and armed is not None:
                cg_usage = replace(cg_usage, cpu_ms=max(cg_usage.cpu_ms - armed.cpu_base_ms, 0.0))
            return observed(
                launched,
                cg_usage,
                request,
                cancel_reason=cancellation.reason,
                artifacts=artifacts,
                rejected=rejected,
                enforcement=self._enforcement(request, layers, start, sockets),
                start=start,
            )
        finally:
            # The result is complete: the sandbox is destroyed off the call path.
            self._teardown.submit(destroyer(child, cgroup))
            if pool is not None:
                pool.run_finished()

    def _enforcement(
        self, request: RunRequest, layers: Any, start: StartInfo, sockets: SandboxSockets | None
    ) -> Any:
        cold = self.backend.enforcement(request, layers, sockets)
        ll = dict(cold.layers)
        ll.pop("bubblewrap", None)
        ll["user_namespace"] = (
            f"uid {os.geteuid()} mapped to sandbox uid 1000 (a user namespace of the run's own, "
            "nested in the template's), no capabilities"
        )
        ll["mount_namespace"] = (
            f"runtime read-only, private /tmp, {SANDBOX_WORKDIR}, /dev/shm and /proc, "
            "inputs read-only (moved in as detached trees)"
        )
        ll["network_namespace"] = "empty (loopback only), the run's own"
        ll["warm_start"] = (
            f"{start.mode} {start.template}: forked from a template (bubblewrap "
            f"{self.backend.bwrap.version_text}) that never ran untrusted code, then isolated as "
            "a fresh sandbox; full seccomp filter installed in the run's process"
        )
        if start.mode == "pool" and layers.landlock_abi is not None and layers.landlock_abi >= 4:
            ll["warm_start"] += (
                f"; restricted before its profile was known, so TCP connect to port {PROXY_PORT} "
                "stays allowed, where only an egress bridge can listen"
            )
        if request.mode.value == "rlimits":
            ll["rlimits"] += " (address space counted above the template's mappings)"
        return replace(cold, layers=ll)


def _quiescer(cgroup: cgroups.RunCgroup) -> Callable[[], bool]:
    """Freeze the run's cgroup; a group that would not freeze is thawed again, so that pid 1
    can end the run the ordinary way."""

    def quiesce() -> bool:
        if cgroup.freeze():
            return True
        cgroup.thaw()
        return False

    return quiesce
