"""The gVisor backend: each run in its own ``runsc`` sandbox, a user-space kernel in between.

:meth:`GVisorBackend.run` reads as the order of containment:

1. decide the layers for this request and fail closed on any that cannot be enforced (cgroups in
   the strict mode, Landlock when required);
2. lay out the bundle: a size-capped tmpfs workspace, the read-only control files (the agent,
   the boot, the program), an empty read-only root, ``config.json`` (:mod:`.plan`, pure), and
   the run's cgroup (:mod:`.sandbox`);
3. start ``runsc run`` inside the cgroup (root) or inside the workspace helper (rootless), send
   the request to the agent, and supervise: wall time, CPU time polled from the host, output
   caps, cancellation (:mod:`.supervise`);
4. classify how it ended (the one classifier, ``host/outcome.py``), export the declared files
   from the workspace once no sandbox process is alive, and remove everything: the container's
   state (``runsc delete --force``), the cgroup, the mount, the directory.

With ``warm=WarmConfig(mode="pool")`` runs take a sandbox that was started ahead of time (its
agent waiting, the preload imported) and used once (:mod:`.pool`). Every sandbox mounts and
boots the request's runtime (``RunRequest.runtime``, None: ``default``); the pool's are made of
``WarmConfig.runtime``, and a run in another runtime starts cold. A session keeps one sandbox
alive across cells, the namespaces backend's kernel in it (:meth:`GVisorBackend.session_sandbox`,
:mod:`.session`).

A run whose profile reaches outside (a network allowlist, tools) is given its socket directory
(``sandcell.run_sockets``): hard links to the run's sockets and client files in a private
directory of the run, bound read-only at ``/run/sandcell`` (a pooled sandbox, started before
any profile is known, binds an empty one and is filled as a run takes it, ``pool.py``), runsc's
connect-only host socket setting (``--host-uds=open``), the proxy variables in the program's
environment, and the egress bridge, started by the agent in the sandbox's own loopback before
the program. The sandbox still has no network device.

Inside the sentry the program also gets the namespaces backend's seccomp filter (installed by
the agent, applied by gVisor), so the calls that policy refuses are refused the same way here,
even those the sentry would emulate (ptrace, io_uring, user namespaces, netlink). The agent stays
as pid 1 and reports the program's own wait status after ending every other process, so an exit
status of 137 is not mistaken for SIGKILL.

What differs from the namespaces backend, by design: the program's system calls are served by
gVisor's sentry (it reports Linux 4.4.0), not the host kernel; ``/sys`` is the sentry's synthetic
one; rootless, the program is uid 0 *inside the sentry* (no capabilities, empty bounding set,
no_new_privs), because runsc's gofer can only create files as the invoking user; the CPU-time
limit counts the whole sandbox (gVisor's own work included) and is enforced by the host.

Security limitations: the sentry and the gofer are host processes (under runsc's own seccomp
filters and namespaces); a bug in them, or in the host-kernel surface they use, is an escape.
The ptrace platform is the slowest gVisor platform; it is the only one working on this host.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.backends.base import (
    BackendResult,
    BackendStatus,
    Collector,
    OutputSink,
    started_cold,
)
from sandcell.backends.gvisor import proctree, runsc
from sandcell.backends.gvisor.sandbox import AGENT_SCRIPT, GSandbox, Host, fixed_for
from sandcell.backends.gvisor.supervise import CPU_POLL_S, supervise
from sandcell.backends.host import cgroups, landlock, node_program, seccomp, workspace
from sandcell.backends.host.layout import SANDBOX_WORKDIR
from sandcell.backends.host.observe import observed
from sandcell.backends.host.process import Launched, StopPipe
from sandcell.backends.host.runs import RunRegistry
from sandcell.backends.host.sweep import sweep as host_sweep
from sandcell.backends.warm import SandboxPoolStats, WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.run_sockets import SANDBOX_DIR, SANDBOX_LIB, SandboxSockets
from sandcell.spec import (
    Artifact,
    Enforcement,
    IsolationMode,
    Outcome,
    RejectedExport,
    RunRequest,
    StartInfo,
)

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint

_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class GVisorBackend:
    """Runs each program in a fresh gVisor sandbox. One instance serves many runs.

    ``warm``: ``mode="pool"`` keeps ``pool_size`` sandboxes started ahead of time, each used
    once (see ``pool.py``). ``mode="template"`` is refused: gVisor's checkpoint and restore was
    measured slower than a cold start for a plain program here (see the README's numbers).
    """

    name = "gvisor"

    def __init__(self, warm: WarmConfig | None = None) -> None:
        if warm is not None and warm.mode != "pool":
            raise IsolationUnavailable(
                "gvisor warm start",
                f"warm mode {warm.mode!r} is not offered by the gVisor backend (checkpoint and "
                "restore starts slower than a cold run for short programs on this platform)",
                "use WarmConfig(mode='pool') (--start pool), or start cold",
            )
        self.runsc = runsc.find_runsc()
        self.root = workspace.prepare_root()
        cg = cgroups.detect()
        self._cgroup_host = cg
        self._cgroup_error = cg if isinstance(cg, IsolationUnavailable) else None
        self._seccomp_policy = seccomp.build_policy(seccomp.native_arch())
        code = {
            "seccomp_program": self._seccomp_policy.compile(),
            "agent_code": landlock.boot_bytecode("/sandcell/agent.py", script=AGENT_SCRIPT),
            "boot_code": landlock.boot_bytecode(),
            "display_code": landlock.boot_bytecode(
                "/sandcell/display.py", script=landlock.DISPLAY_SCRIPT
            ),
        }
        self._hosts = {
            IsolationMode.RLIMITS: Host(runsc=self.runsc, root=self.root, cgroup_host=None, **code)
        }
        if isinstance(cg, cgroups.CgroupHost):
            self._hosts[IsolationMode.STRICT] = Host(
                runsc=self.runsc, root=self.root, cgroup_host=cg, **code
            )
        self.runs = RunRegistry()
        self._ids = itertools.count()
        sweep(self.runsc)
        self._pool = None
        if warm is not None:
            from sandcell.backends.gvisor.pool import GVisorPool

            self._pool = GVisorPool(self, warm)

    # -- 1. layers -------------------------------------------------------------------------

    def decide(self, request: RunRequest) -> Host:
        """The host side for ``request``; raises IsolationUnavailable for a layer it lacks."""
        if request.landlock is True:
            raise IsolationUnavailable(
                "landlock",
                "Landlock is a host-kernel layer; programs under gVisor never reach the host "
                "kernel's file system calls, so it cannot be applied to them",
                "run without requiring Landlock (the sentry and its gofer mediate every file "
                "access), or use the namespaces backend",
            )
        host = self._hosts.get(request.mode)
        if host is None:
            assert self._cgroup_error is not None
            raise self._cgroup_error
        return host

    def versions(self) -> Mapping[str, str]:
        return {**runsc.versions(self.runsc), "kernel_seen_by_program": "gVisor sentry (4.4.0)"}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def cancel_all(self, reason: str) -> int:
        return self.runs.cancel_all(reason)

    def cancel(self, run_id: str, reason: str) -> bool:
        return self.runs.cancel(run_id, reason)

    def warm_stats(self) -> SandboxPoolStats | None:
        """The pool, as it is now (None without warm starts)."""
        return self._pool.stats() if self._pool is not None else None

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        """A live sandbox for one session (not started yet; see ``session.py``)."""
        from sandcell.backends.gvisor.session import GVisorSessionSandbox

        return GVisorSessionSandbox(
            self, request, session_id=session_id, sockets=sockets, restore=restore
        )

    def new_name(self, run_id: str) -> str:
        """A container name for a run: unique in this supervisor, readable in ``runsc list``."""
        return f"{next(self._ids)}-{_ID_CHARS.sub('_', run_id)[:48]}"

    # -- the run ---------------------------------------------------------------------------

    def run(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        if self._pool is None:
            return self._run_cold(
                request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
            )
        warm = self._pool.run(
            request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
        )
        if isinstance(warm, BackendResult):
            return warm
        # Nothing ran pooled, so on_output was told nothing yet.
        cold = self._run_cold(
            request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
        )
        return started_cold(cold, warm)

    def _run_cold(
        self,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        sockets: SandboxSockets | None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        host = self.decide(request)
        fixed = fixed_for(request, host, sockets)
        sb = GSandbox(host, name=self.new_name(run_id), fixed=fixed)
        try:
            sb.create()
            if sockets is not None:
                sb.attach_sockets(sockets)
            t0 = time.monotonic()
            sb.spawn()
            sb.deliver(request, sockets)
            return self.finish(
                sb,
                request,
                run_id=run_id,
                collect=collect,
                t0=t0,
                sockets=sockets,
                on_output=on_output,
            )
        finally:
            sb.destroy()

    def finish(
        self,
        sb: GSandbox,
        request: RunRequest,
        *,
        run_id: str,
        collect: Collector,
        t0: float,
        start: StartInfo | None = None,
        cpu_baseline_ms: float = 0.0,
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        """Supervise a sandbox whose request was sent, then observe and export (the caller
        destroys the sandbox). ``cpu_baseline_ms``: CPU time the sandbox had used before the
        request (a pooled sandbox's preload), not charged to the program; ``on_output``: told
        the program's output as it is read."""
        stop = StopPipe()
        try:
            with self.runs.register(run_id, stop.set) as cancellation:
                launched = supervise(
                    sb,
                    limits=request.effective_limits,
                    stop=stop,
                    t0=t0,
                    cpu_ms=cpu_reader(sb, cpu_baseline_ms),
                    on_output=on_output,
                )
        finally:
            stop.close()
        # Nothing of the sandbox may be alive while the workspace is read.
        sb.kill()
        if cpu_baseline_ms:
            launched = replace(
                launched, cpu_ms_rusage=max(launched.cpu_ms_rusage - cpu_baseline_ms, 0.0)
            )
        cg_usage = sb.cgroup.usage() if sb.cgroup is not None else None
        if cg_usage is not None and cg_usage.cpu_ms is not None:
            cg_usage = replace(cg_usage, cpu_ms=max(cg_usage.cpu_ms - cpu_baseline_ms, 0.0))
        collected: tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]] = ((), ())
        if launched.started:
            collected = collect(sb.workspace_view())
        result = observed(
            launched,
            cg_usage,
            request,
            cancel_reason=cancellation.reason,
            artifacts=collected[0],
            rejected=collected[1],
            enforcement=self.enforcement(request, sb.host, sockets, pooled=start is not None),
            start=start,
        )
        return _cpu_outcome(result, launched, request)

    def enforcement(
        self,
        request: RunRequest,
        host: Host,
        sockets: SandboxSockets | None = None,
        *,
        pooled: bool = False,
    ) -> Enforcement:
        """The enforcement report of a sandbox on ``host`` (what is active, what is weaker);
        ``sockets``: the run's ways out; ``pooled``: a pooled sandbox (its socket view is
        there, empty without ways out)."""
        limits = request.effective_limits
        rootless = host.runsc.rootless
        uid = host.sandbox_uid
        ll: dict[str, str] = {
            "gvisor": host.runsc.describe(),
            "kernel": "gVisor sentry: the program's system calls never reach the host kernel "
            "directly (it reports Linux 4.4.0)",
            "user": f"uid {uid} inside the sentry, no capabilities, empty bounding set, "
            "no_new_privs"
            + (" (rootless runsc: the invoking user on the host)" if rootless else ""),
            "namespaces": "pid, ipc, uts, mount of the sentry",
            "network": "none (--network=none: loopback only)"
            + (
                f"; host Unix sockets: connect only (--host-uds={runsc.HOST_UDS}), to the run's "
                f"own under {SANDBOX_DIR} (read-only)"
                if sockets is not None
                else "; host Unix sockets: connect only, and the pooled sandbox's socket view "
                "is empty (no /run)"
                if pooled and host.runsc.host_uds
                else ""
            ),
            "filesystem": f"read-only root, runtime read-only, private /tmp "
            f"({limits.tmp_bytes} bytes), {SANDBOX_WORKDIR}, inputs read-only; through the gofer",
            "rlimits": "open files, file size, processes, core"
            + (", address space" if request.mode is IsolationMode.RLIMITS else ""),
            "cpu_time": f"whole sandbox (the sentry's own work included), polled by the host every "
            f"{CPU_POLL_S:g} s from the "
            + ("cgroup" if host.cgroup_host is not None else "process tree")
            + ", killed at the limit",
            "wall_time": "enforced by the host (the sandbox is killed)",
            "workspace_quota": f"tmpfs of {limits.workspace_bytes} bytes"
            + (" in the workspace helper's mount namespace" if rootless else " on the host"),
            "environment": "only the runtime's and the request's",
            "no_new_privs": "yes",
            "seccomp": self._seccomp_policy.describe()
            + "; applied by gVisor to the program, installed by the agent before it starts",
            **node_program.layers(request.language, request.mode),
        }
        if sockets is not None:
            ll["run_sockets"] = (
                f"{sockets.describe()}: the run's socket directory bound read-only at "
                f"{SANDBOX_DIR} (sandcell_tools importable from {SANDBOX_LIB}), reached through "
                "the gofer"
                + (
                    "; the bridge runs in the sandbox, forked by the agent under the program's "
                    "uid, rlimits and seccomp filter, and ends with it"
                    if sockets.egress
                    else ""
                )
            )
        weakened: list[str] = []
        if host.cgroup_host is not None:
            ll["cgroups"] = (
                host.cgroup_host.describe() + ": memory (no swap), pids (a backstop above the "
                "program's limit: gVisor's threads count too), cpu usage"
            )
        else:
            weakened.append(
                "cgroups: memory by RLIMIT_AS inside gVisor, processes by RLIMIT_NPROC, CPU time "
                "from the host's process tree"
            )
        # No "landlock" layer: the program never reaches the host kernel's file system calls
        # (the sentry and its gofer mediate them), so Landlock has nothing to apply to.
        if request.landlock is False:
            weakened.append("landlock: disabled by request (not applicable under gVisor)")
        return Enforcement(
            backend=self.name, layers=ll, mode=request.mode, weakened=tuple(weakened)
        )


def cpu_reader(sb: GSandbox, baseline_ms: float = 0.0) -> Callable[[], float | None]:
    """The sandbox's CPU milliseconds since ``baseline_ms``: its cgroup's, else its process
    tree's."""
    if sb.cgroup is not None:
        cg = sb.cgroup

        def from_cgroup() -> float | None:
            used = cg.usage().cpu_ms
            return None if used is None else used - baseline_ms

        return from_cgroup
    proc = sb.proc
    assert proc is not None

    def from_tree() -> float | None:
        return proctree.tree_cpu_ms(proc.pid) - baseline_ms

    return from_tree


def _cpu_outcome(result: BackendResult, launched: Launched, request: RunRequest) -> BackendResult:
    if launched.stopped_by != "cpu_time" or (
        result.outcome is Outcome.KILLED and (result.reason.startswith("cancelled"))
    ):
        return result
    secs = request.effective_limits.cpu_time_s
    return replace(
        result,
        outcome=Outcome.TIMEOUT,
        reason=f"CPU-time limit of {secs} s reached (the whole sandbox's CPU time, measured by "
        "the host)",
    )


def sweep(rs: runsc.Runsc | None = None) -> list[str]:
    """Remove what dead supervisors left: containers (``runsc delete --force``), then run
    directories, mounts and cgroups (the namespaces backend's sweep: same layout). Returns what
    went."""
    removed: list[str] = []
    if rs is not None:
        with contextlib.suppress(OSError):
            for name in os.listdir(rs.state_dir):
                if name.startswith(".gvcheck-"):
                    owner = name.removeprefix(".gvcheck-").rpartition("-")[0]
                    if not workspace.owner_alive(owner):
                        shutil.rmtree(rs.state_dir / name, ignore_errors=True)
        dead = [c for c in runsc.container_ids(rs) if not workspace.owner_alive(runsc.owner_of(c))]
        # Its processes first (runsc, gofer, sentry: each names the container in its command
        # line), so that no runsc rewrites the state while it is deleted.
        proctree.kill_matching(
            [f" {c}" for c in dead] + [f"/gv-{c.partition('.')[2]}" for c in dead]
        )
        for cid in dead:
            runsc.delete(rs, cid)
            runsc.forget(rs, cid)
            removed.append(f"container {cid}")
    removed += host_sweep()
    return removed


def sweep_stale() -> list[str]:
    """:func:`sweep` without a backend (the registry's, for ``sandcell session``): the containers
    of dead supervisors (a gVisor session's server killed by SIGKILL), with their processes, run
    directories, mounts and cgroups. runsc is looked for only when such a container is there:
    finding it starts a test container."""
    try:
        names = os.listdir(workspace.runs_root() / runsc.STATE_DIRNAME)
    except OSError:
        return []
    ids = {name.partition("_sandbox:")[0] for name in names if "_sandbox:" in name}
    if all(workspace.owner_alive(runsc.owner_of(cid)) for cid in ids):
        return []
    try:
        found = runsc.find_runsc()
    except IsolationUnavailable:
        return []
    return sweep(found)


def probe() -> BackendStatus:
    """Whether this host can run the gVisor backend: runsc found, and a container started."""
    try:
        rs = runsc.find_runsc()
    except IsolationUnavailable as exc:
        return BackendStatus(name="gvisor", usable=False, detail=exc.reason, fix=exc.fix)
    detail = rs.describe()
    cg = cgroups.detect()
    if isinstance(cg, IsolationUnavailable):
        detail += f"; strict mode unavailable ({cg.reason}), --isolation rlimits works"
    return BackendStatus(name="gvisor", usable=True, detail=detail, fix=None)


__all__ = ["GVisorBackend", "probe", "sweep", "sweep_stale"]
