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
cgroup) is destroyed on a background thread (``_Teardown``, bounded backlog; ``close`` waits
for it). Runs are registered with the backend's run registry, so ``cancel_all`` stops them.

Measured on the 2-core development host, loaded by other work (medians; ``bench/bench_warm.py``
for the backend call, ``Executor.run`` for call to result; HEAD before this change vs after):

================================  ==========  ==========
pool mode                         before      after
================================  ==========  ==========
backend, print(1)                 39.5 ms     11.9 ms
backend, pandas snippet           45.2 ms     17.7 ms
Executor.run, print(1)            40.7 ms     16.7 ms
Executor.run, pandas snippet      46.8 ms     22.3 ms
Executor.run, pandas, display     cold        24.1 ms
idle pooled sandbox, PSS          13.5 MiB    10.4 MiB
================================  ==========  ==========

Where the ~17 ms of a pooled print(1) go now (host timestamps): executor before the backend
(admission, which is the analysis of the code itself) ~0.8 ms; request sent to program started
2-8 ms (pid 1's mounts, prlimit, its own capability drop and seccomp, the hand-over to the
program: under 1 ms of CPU, the rest is three processes waking each other on two busy cores);
the program ~1.5 ms; its exit 3-10 ms: the kernel tears down the copy of the pandas-sized image
before pid 1 can reap it, and pid 1 reports only then (the exports are read from a quiet
workspace); status read to return ~1 ms plus the record (validation and audit append) ~1.7 ms.
The 3 ms target is out of reach with this design in Python: the floor is the program's exit
(page tables of the template image) plus two cross-process wake-ups plus the record. Refilling
costs three forks of the template image per sandbox (template -> C -> G -> P) plus a cgroup
attach, which caps back-to-back throughput at about 35-40 runs/s here.

What the cold path still serves (and the record says why, in the enforcement layer
``warm_start``): bash, packages from the wheel cache, and any run while the template is down.
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
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sandcell.backends.base import BackendResult, Collector
from sandcell.backends.namespaces import _trees, cgroups, landlock, seccomp, workspace
from sandcell.backends.namespaces.bwrap import SANDBOX_WORKDIR
from sandcell.backends.namespaces.launcher import Launched, StopPipe
from sandcell.backends.namespaces.pool import PoolStats, WarmPool, idle_memory
from sandcell.backends.namespaces.rlimits import plan_rlimits
from sandcell.backends.namespaces.template import (
    ZYGOTE_SCRIPT,
    Armed,
    Template,
    WarmChild,
    compile_script,
    recv_message,
    send_message,
)
from sandcell.display import DISPLAY_DIRNAME
from sandcell.errors import ConfigError, InfraError, IsolationUnavailable
from sandcell.runtimes import common_env, runtime_for
from sandcell.spec import Limits, RunRequest, StartInfo, Usage

if TYPE_CHECKING:
    from sandcell.backends.namespaces import NamespacesBackend

__all__ = ["WarmConfig", "WarmStarter", "WarmStats"]

_READ_CHUNK = 65536
_DISPLAY_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"
_INPUTS = "/inputs"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmConfig:
    """How python runs start: from a template, or from a pool of children forked ahead."""

    mode: Literal["template", "pool"] = "template"
    """``template``: fork at call time; ``pool``: take a child forked ahead of time."""
    preload: tuple[str, ...] = ("numpy", "pandas")
    """Modules the template imports once (trusted runtime code, never the program's)."""
    pool_size: int = 4
    """Children kept waiting in ``pool`` mode."""
    start_timeout_s: float = 120.0
    """How long the template may take to import ``preload``."""
    take_timeout_s: float = 30.0
    """How long a run waits for a pooled child before it starts cold."""

    def __post_init__(self) -> None:
        if self.mode not in ("template", "pool"):
            raise ConfigError(f"warm start mode {self.mode!r}: choose 'template' or 'pool'")
        if isinstance(self.preload, str):
            raise ConfigError("preload is a tuple of module names, not one string")
        for name in self.preload:
            if not _MODULE.match(name):
                raise ConfigError(f"preload: {name!r} is not a module name")
        if not 1 <= self.pool_size <= 256:
            raise ConfigError(f"pool_size must be between 1 and 256, got {self.pool_size}")
        if self.start_timeout_s <= 0 or self.take_timeout_s <= 0:
            raise ConfigError("warm start timeouts must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStats:
    """What :meth:`WarmStarter.stats` reports."""

    mode: str
    template_id: str | None
    template_pid: int | None
    """Host pid of the template process (unchanged across runs while it lives)."""
    template_state: Mapping[str, Any]
    """The template's own report: threads, number of modules, sys.modules digest."""
    template_pss_bytes: int
    template_restarts: int
    runs: int
    fallbacks: int
    pool: PoolStats | None
    cgroup_prefix: str
    """Start of the names of this starter's pooled cgroups (the owner tag, then its own tag)."""


class WarmStarter:
    """The warm-start half of :class:`NamespacesBackend` (one per backend)."""

    def __init__(self, backend: NamespacesBackend, config: WarmConfig) -> None:
        self.backend = backend
        self.config = config
        self.runtime = runtime_for("python")
        self._zygote_code = compile_script(ZYGOTE_SCRIPT, "/sandcell/zygote.py")
        self._setup_seccomp = seccomp.build_setup_policy(backend.arch).compile()
        self._display_code = landlock.boot_bytecode(
            f"{landlock.SANDBOX_DIR}/display.py", script=landlock.DISPLAY_SCRIPT
        )
        host = backend._cgroup_host
        self._cgroup_host = host if isinstance(host, cgroups.CgroupHost) else None
        self._swap = (
            False if self._cgroup_host is None else cgroups.swap_accounting(self._cgroup_host)
        )
        self._landlock_abi = backend._landlock_abi
        # The limits pooled sandboxes are prepared with: those of the last run served (a
        # profile's runs usually share them), so that a take rarely has a limit to rewrite.
        defaults = Limits()
        self._fill_limits = (defaults.memory_bytes, defaults.max_pids)
        self._plans: dict[int, dict[str, Any]] = {}
        self._env = {**common_env(), **self.runtime.env}
        self._teardown = _Teardown()
        self.cgroup_prefix = f"{workspace.owner_tag()}.w{uuid.uuid4().hex[:8]}-"
        self._lock = threading.Lock()
        self._template: Template | None = None
        self._pool: WarmPool | None = None
        self._restarts = -1
        self._runs = self._fallbacks = 0
        self._tree_helper = Path(_trees.__file__)
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
            boot_code=self.backend._boot_code,
            zygote_code=self._zygote_code,
            display_code=self._display_code,
            setup_seccomp=self._setup_seccomp,
            preload=self.config.preload,
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
        memory_bytes, max_pids = self._fill_limits
        cgroup: cgroups.RunCgroup | None = None
        try:
            if self._cgroup_host is not None:
                name = f"{self.cgroup_prefix}{uuid.uuid4().hex[:12]}"
                cgroup = cgroups.RunCgroup(self._cgroup_host, name)
                cgroup.create(
                    cgroups.plan_settings(
                        self._cgroup_host.version,
                        memory_bytes=memory_bytes,
                        max_pids=max_pids,
                        swap_accounting=self._swap,
                    )
                )
                cgroup.attach(child.init_pid)
            arm = {"arm": {"landlock": self._landlock_plan(self._landlock_abi)}}
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
        )

    # -- serving a run ---------------------------------------------------------------------

    def unservable(self, request: RunRequest) -> str | None:
        """Why this request starts cold, or None when a warm start can serve it."""
        if request.language != "python":
            return f"{request.language} programs start cold (the template is a python interpreter)"
        if request.packages:
            return "runs with packages from the wheel cache start cold"
        return None

    def run(self, request: RunRequest, *, run_id: str, collect: Collector) -> BackendResult | str:
        """The run's result, or why it must start cold instead (nothing ran then)."""
        reason = self.unservable(request)
        if reason is not None:
            self._fallbacks += 1
            return reason
        layers = self.backend._decide(request)  # fails closed as a cold start would
        try:
            trees = self._input_trees(request)
        except (OSError, InfraError) as exc:
            self._fallbacks += 1
            return f"inputs could not be prepared for a warm start: {exc}"
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
                preloaded=self.config.preload,
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
            )
        finally:
            for fd in trees:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _input_trees(self, request: RunRequest) -> list[int]:
        paths = [str(i.host_path) for i in request.inputs]
        if not paths:
            return []
        if os.geteuid() == 0:
            return _trees.open_trees(paths)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with parent:
            try:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-I",
                        "-S",
                        str(self._tree_helper),
                        str(child.fileno()),
                        *paths,
                    ],
                    pass_fds=(child.fileno(),),
                    capture_output=True,
                    timeout=30,
                    check=False,
                    env={},
                )
            finally:
                child.close()
            msg, fds, _, _ = socket.recv_fds(parent, 4096, len(paths))
        if proc.returncode != 0 or msg != b"K" or len(fds) != len(paths):
            for fd in fds:
                os.close(fd)
            raise InfraError(
                f"the input helper failed: {msg.decode(errors='replace')[1:]} "
                f"{proc.stderr.decode(errors='replace').strip()}"
            )
        return list(fds)

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
    ) -> BackendResult:
        from sandcell.backends.namespaces import _classify

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
                    self._retune(cgroup, armed, limits)
            elif layers.cgroup_host is not None:
                cgroup = cgroups.RunCgroup(layers.cgroup_host, f"{workspace.owner_tag()}.{run_id}")
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
            stop = StopPipe()
            try:
                # Cancellable as a cold run is: the stop ends it as its wall limit would.
                with self.backend.runs.register(run_id, stop.set) as cancellation:
                    launched, artifacts, rejected = _drive(
                        child,
                        self._request_doc(request, layers),
                        request,
                        trees,
                        collect,
                        stop_fd=stop.r,
                    )
            finally:
                stop.close()
            cg_usage = cgroup.usage() if cgroup is not None else None
            if cg_usage is not None and cg_usage.cpu_ms is not None and armed is not None:
                cg_usage = replace(cg_usage, cpu_ms=max(cg_usage.cpu_ms - armed.cpu_base_ms, 0.0))
            outcome, reason = _classify(
                launched, cg_usage, request, cancel_reason=cancellation.reason
            )
            usage = Usage(
                wall_ms=round(launched.wall_ms, 3),
                cpu_ms=round(cg_usage.cpu_ms, 3)
                if cg_usage and cg_usage.cpu_ms is not None
                else round(launched.cpu_ms_rusage, 3),
                peak_memory_bytes=cg_usage.peak_memory_bytes
                if cg_usage and cg_usage.peak_memory_bytes is not None
                else launched.maxrss_bytes_rusage,
            )
            return BackendResult(
                outcome=outcome,
                exit_code=launched.exit_code,
                signal=launched.signal,
                stdout=launched.stdout,
                stderr=launched.stderr,
                stdout_truncated=launched.stdout_truncated,
                stderr_truncated=launched.stderr_truncated,
                usage=usage,
                artifacts=artifacts,
                rejected_exports=rejected,
                enforcement=self._enforcement(request, layers, start),
                reason=reason,
                start=start,
            )
        finally:
            # The result is complete: the sandbox is destroyed off the call path.
            self._teardown.submit(_destroyer(child, cgroup))
            if pool is not None:
                pool.run_finished()

    def _retune(self, cgroup: cgroups.RunCgroup, armed: Armed, limits: Limits) -> None:
        """Write the limits of this run where they differ from the prepared ones."""
        self._fill_limits = (limits.memory_bytes, limits.max_pids)
        if (armed.memory_bytes, armed.max_pids) == self._fill_limits:
            return
        host = cgroup.host
        settings = cgroups.plan_settings(
            host.version,
            memory_bytes=limits.memory_bytes,
            max_pids=limits.max_pids,
            swap_accounting=self._swap,
        )
        memory_files = ("memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        changed = [
            s
            for s in settings
            if not s.optional
            and (
                (s.file in memory_files and limits.memory_bytes != armed.memory_bytes)
                or (s.file == "pids.max" and limits.max_pids != armed.max_pids)
            )
        ]
        if limits.memory_bytes > armed.memory_bytes:
            # v1: memory+swap may never be below memory alone, so it grows first.
            changed.reverse()
        try:
            for s in changed:
                (cgroup.dirs[s.controller] / s.file).write_text(s.value)
        except OSError as exc:
            raise InfraError(f"could not set the limits of the pooled sandbox: {exc}") from exc

    def _landlock_plan(self, abi: int | None) -> dict[str, Any] | None:
        """The program's Landlock rules, the same for every run (``/inputs`` is always readable:
        it is empty, or the run's inputs mounted read-only), so a pooled child applies them
        before its request exists."""
        if abi is None:
            return None
        plan = self._plans.get(abi)
        if plan is None:
            plan = landlock.build_plan(
                runtime_paths=[*self.runtime.ro_dirs, *(link for link, _ in self.runtime.symlinks)],
                input_dir=_INPUTS,
                work_dir=SANDBOX_WORKDIR,
                abi=abi,
            ).to_dict()
            self._plans[abi] = plan
        return plan

    def _request_doc(self, request: RunRequest, layers: Any) -> dict[str, Any]:
        limits = request.effective_limits
        return {
            "script": "main.py",
            "code": request.code,
            "display": _DISPLAY_DIR if request.display else None,
            "env": {**self._env, **request.env},
            "limits": {
                "tmp_bytes": limits.tmp_bytes,
                "workspace_bytes": limits.workspace_bytes,
                "workspace_inodes": limits.workspace_inodes,
            },
            "rlimits": [
                [r.name, r.soft, r.hard, r.name == "RLIMIT_AS"]
                for r in plan_rlimits(limits, request.mode)
            ],
            "inputs": [i.name for i in request.inputs],
            "input_dirs": {i.name: i.host_path.is_dir() for i in request.inputs},
            "landlock": self._landlock_plan(layers.landlock_abi),
        }

    def _enforcement(self, request: RunRequest, layers: Any, start: StartInfo) -> Any:
        cold = self.backend._enforcement(request, layers)
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
        if request.mode.value == "rlimits":
            ll["rlimits"] += " (address space counted above the template's mappings)"
        return replace(cold, layers=ll)


# -- teardown off the call path -----------------------------------------------------------------


def _destroyer(child: WarmChild, cgroup: cgroups.RunCgroup | None) -> Callable[[], None]:
    def destroy() -> None:
        # End-of-file and SIGKILL end pid 1, and with it the run's pid namespace; then nothing
        # of the run may be left in its cgroup when the cgroup goes (a pooled child's own
        # cgroup goes with discard()).
        child.discard()
        if cgroup is not None and child.armed is None:
            cgroup.kill_all()
            cgroup.remove()

    return destroy


class _Teardown:
    """Destroys used sandboxes on one worker thread, after their results were returned.

    The backlog is bounded: when it is full, the next run waits for room, so a burst of runs
    can never leave an unbounded number of dead sandboxes behind. :meth:`drain` returns once
    every submitted sandbox is gone.
    """

    def __init__(self, backlog: int = 32) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=backlog)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, destroy: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="sandcell-teardown", daemon=True
                )
                self._thread.start()
        self._queue.put(destroy)

    def drain(self) -> None:
        self._queue.join()

    def _work(self) -> None:
        while True:
            destroy = self._queue.get()
            try:
                destroy()
            except Exception:  # noqa: S110 - one failed teardown must not stop the others;
                pass  # the sweep at the next start removes what it left
            finally:
                self._queue.task_done()


# -- one run on one child -----------------------------------------------------------------------


def _stdin_fd(data: bytes) -> int:
    fd = os.memfd_create("sandcell-stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _parse_status(data: bytes) -> tuple[bool, int | None, float, int]:
    """(started, wait status, cpu ms, max rss bytes) from the status pipe's bytes."""
    started = data.startswith(b"1")
    _, marker, rest = data.partition(b"W")
    if not marker or not rest.endswith(b"\n"):
        return started, None, 0.0, 0
    try:
        status, cpu, rss = rest.split()
        return started, int(status), float(cpu), int(rss)
    except ValueError:
        return started, None, 0.0, 0


def _drive(
    child: WarmChild,
    doc: dict[str, Any],
    request: RunRequest,
    trees: list[int],
    collect: Collector,
    *,
    stop_fd: int,
) -> tuple[Launched, tuple[Any, ...], tuple[Any, ...]]:
    """Send the request, pump the output under the limits, read the status, export."""
    limits = request.effective_limits
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    st_r, st_w = os.pipe2(os.O_CLOEXEC)
    stdin = _stdin_fd(request.stdin)
    ours = [out_r, err_r, st_r]
    try:
        try:
            send_message(child.sock, json.dumps(doc).encode(), [stdin, out_w, err_w, st_w, *trees])
        except OSError as exc:
            raise InfraError(f"the warm sandbox did not take its request: {exc}") from exc
        finally:
            for fd in (stdin, out_w, err_w, st_w):
                os.close(fd)
        t0 = time.monotonic()
        deadline = t0 + limits.wall_time_s
        out, err, status = bytearray(), bytearray(), bytearray()
        out_trunc = err_trunc = False
        stopped_by: str | None = None
        open_fds = {out_r: "stdout", err_r: "stderr", st_r: "status"}
        while open_fds and not stopped_by:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped_by = "wall_time"
                break
            ready, _, _ = select.select([*open_fds, stop_fd], [], [], remaining)
            if stop_fd in ready:
                stopped_by = "cancelled"
                break
            ready.sort(key=lambda fd: fd != st_r)
            for fd in ready:
                chunk = os.read(fd, _READ_CHUNK)
                kind = open_fds[fd]
                if not chunk:
                    del open_fds[fd]
                elif kind == "status":
                    status += chunk
                elif kind == "stdout":
                    room = limits.stdout_bytes - len(out)
                    out += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        out_trunc, stopped_by = True, stopped_by or "stdout"
                else:
                    room = limits.stderr_bytes - len(err)
                    err += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        err_trunc, stopped_by = True, stopped_by or "stderr"
        if stopped_by:
            # SIGTERM from outside the namespace asks pid 1 to kill everything else in it; the
            # workspace stays for the exports, as in a cold run.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.init_pid, signal.SIGTERM)
        # The status pipe closes once pid 1 reported; bounded, in case it died instead.
        end = time.monotonic() + 10
        while st_r in open_fds and time.monotonic() < end:
            if select.select([st_r], [], [], max(end - time.monotonic(), 0))[0]:
                chunk = os.read(st_r, _READ_CHUNK)
                if not chunk:
                    break
                status += chunk
        wall_ms = (time.monotonic() - t0) * 1000
        started, wait_status, cpu_ms, maxrss = _parse_status(bytes(status))
        artifacts: tuple[Any, ...] = ()
        rejected: tuple[Any, ...] = ()
        code: int | None
        sig: int | None
        if wait_status is None:
            # pid 1 died without a report (killed from outside): nothing left to export.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.init_pid, signal.SIGKILL)
            code, sig = None, signal.SIGKILL
        else:
            code, sig = (
                (None, os.WTERMSIG(wait_status))
                if os.WIFSIGNALED(wait_status)
                else (os.WEXITSTATUS(wait_status), None)
            )
            if started:
                artifacts, rejected = collect(Path(f"/proc/{child.init_pid}/root{SANDBOX_WORKDIR}"))
        return (
            Launched(
                started=started,
                exit_code=code,
                signal=sig,
                stdout=bytes(out),
                stderr=bytes(err),
                stdout_truncated=out_trunc,
                stderr_truncated=err_trunc,
                stopped_by=stopped_by,
                wall_ms=wall_ms,
                cpu_ms_rusage=cpu_ms,
                maxrss_bytes_rusage=maxrss,
            ),
            artifacts,
            rejected,
        )
    finally:
        for fd in ours:
            with contextlib.suppress(OSError):
                os.close(fd)
