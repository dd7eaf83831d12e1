"""Warm starts that stay one sandbox per run: the template fast path and the warm pool.

``NamespacesBackend(warm=WarmConfig(mode="template"))`` starts each python run from a template
process that imported the configured modules once and never runs untrusted code (``_zygote.py``,
``template.py``): the run's own child isolates itself as a fresh sandbox would be (namespaces,
``/proc``, tmpfs workspace and ``/tmp``, inputs read-only, rlimits, no capabilities,
no_new_privs, Landlock, the cold path's full seccomp filter) before the request reaches it, and
the host puts it in the run's cgroup first. ``mode="pool"`` forks those children ahead of time
(``pool.py``); a run takes one, uses it once, and it is destroyed.

What the cold path still serves (and the record says why, in the enforcement layer
``warm_start``): bash, packages from the wheel cache, rich outputs (``display``), and any run while
the template is down. The outcome of a warm run is classified exactly as a cold one's.

Security limitations: see ``_zygote.py`` (shared pre-fork memory image, hash secret, address-space
layout) and ``template.py``. ``/dev`` is read-only and has no ``/dev/pts``. In the ``rlimits``
mode the address-space limit counts from what the template already maps, not from zero. BLAS and
OpenMP pools are single-threaded (set before the template's imports).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sandcell.backends.base import BackendResult, Collector
from sandcell.backends.namespaces import _trees, cgroups, landlock, seccomp, workspace
from sandcell.backends.namespaces.bwrap import SANDBOX_WORKDIR
from sandcell.backends.namespaces.launcher import Launched
from sandcell.backends.namespaces.pool import PoolStats, WarmPool, idle_memory
from sandcell.backends.namespaces.rlimits import plan_rlimits
from sandcell.backends.namespaces.template import (
    ZYGOTE_SCRIPT,
    Template,
    WarmChild,
    compile_script,
    send_message,
)
from sandcell.errors import ConfigError, InfraError
from sandcell.runtimes import common_env, runtime_for
from sandcell.spec import RunRequest, StartInfo, Usage

if TYPE_CHECKING:
    from sandcell.backends.namespaces import NamespacesBackend

__all__ = ["WarmConfig", "WarmStarter", "WarmStats"]

_READ_CHUNK = 65536
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


class WarmStarter:
    """The warm-start half of :class:`NamespacesBackend` (one per backend)."""

    def __init__(self, backend: NamespacesBackend, config: WarmConfig) -> None:
        self.backend = backend
        self.config = config
        self.runtime = runtime_for("python")
        self._zygote_code = compile_script(ZYGOTE_SCRIPT, "/sandcell/zygote.py")
        self._setup_seccomp = seccomp.build_setup_policy(backend.arch).compile()
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
            setup_seccomp=self._setup_seccomp,
            preload=self.config.preload,
        )
        self._template = template
        if self.config.mode == "pool":
            self._pool = WarmPool(lambda: self._fork(template), self.config.pool_size)

    def _fork(self, template: Template) -> WarmChild:
        template.wait_ready(self.config.start_timeout_s)
        return template.fork()

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._template is not None:
            self._template.close()
            workspace.remove_tree(self._template.run_dir)
            self._template = None

    def close(self) -> None:
        with self._lock:
            self._stop()

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
        )

    # -- serving a run ---------------------------------------------------------------------

    def unservable(self, request: RunRequest) -> str | None:
        """Why this request starts cold, or None when a warm start can serve it."""
        if request.language != "python":
            return f"{request.language} programs start cold (the template is a python interpreter)"
        if request.packages:
            return "runs with packages from the wheel cache start cold"
        if request.display:
            return "runs that capture rich outputs start cold"
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
            try:
                template = self.template()
                if self._pool is not None:
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
                mode=self.config.mode,
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
        cgroup: cgroups.RunCgroup | None = None
        try:
            if layers.cgroup_host is not None:
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
            launched, artifacts, rejected = _drive(
                child, self._request_doc(request, layers), request, trees, collect
            )
            cg_usage = cgroup.usage() if cgroup is not None else None
            outcome, reason = _classify(launched, cg_usage, request)
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
            child.discard()
            if cgroup is not None:
                cgroup.kill_all()
                cgroup.remove()

    def _request_doc(self, request: RunRequest, layers: Any) -> dict[str, Any]:
        limits = request.effective_limits
        lplan = None
        if layers.landlock_abi is not None:
            lplan = landlock.build_plan(
                runtime_paths=[*self.runtime.ro_dirs, *(link for link, _ in self.runtime.symlinks)],
                input_dir="/inputs" if request.inputs else None,
                work_dir=SANDBOX_WORKDIR,
                abi=layers.landlock_abi,
            ).to_dict()
        return {
            "script": "main.py",
            "code": request.code,
            "env": {**common_env(), **self.runtime.env, **request.env},
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
            "landlock": lplan,
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
            ready, _, _ = select.select(list(open_fds), [], [], remaining)
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
