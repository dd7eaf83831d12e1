"""The default backend: Linux namespaces via bubblewrap, with seccomp, Landlock, cgroups, rlimits.

:meth:`NamespacesBackend.run` reads as the order of containment:

1. decide the layers for this request and fail closed on any that cannot be enforced;
2. lay out the run directory: a size-capped tmpfs workspace and the read-only control files;
3. create the run's cgroup with its limits;
4. build the bwrap argument list (namespaces, mounts, seccomp) as data;
5. launch: the sandbox init is moved into the cgroup and given its rlimits before it starts the
   program; the boot step inside applies Landlock and closes inherited descriptors;
6. classify how it ended, read usage, export the declared files, and remove everything.

Security limitations: the kernel is shared with the host, so a kernel bug reachable through the
allowed syscalls is an escape; seccomp narrows that surface but is a deny list. Host paths of the
runtime (``/usr``, the Python prefix) are visible read-only. Use the gVisor or microVM backends when
a shared kernel is not acceptable.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from sandcell.backends.base import BackendResult, Collector
from sandcell.backends.namespaces import cgroups, landlock, seccomp, workspace
from sandcell.backends.namespaces.bwrap import (
    PACKAGES_DIR,
    SANDBOX_WORKDIR,
    BwrapPlan,
    build_argv,
    find_bwrap,
)
from sandcell.backends.namespaces.launcher import (
    BOOT_FAILED_STATUS,
    HelperChannel,
    Launched,
    Pipes,
    launch,
)
from sandcell.backends.namespaces.rlimits import apply_rlimits, plan_rlimits
from sandcell.backends.namespaces.warm import WarmConfig, WarmStarter, WarmStats
from sandcell.display import DISPLAY_DIRNAME
from sandcell.errors import IsolationUnavailable
from sandcell.runtimes import Runtime, code_path, common_env, runtime_for
from sandcell.spec import (
    Artifact,
    Enforcement,
    IsolationMode,
    Outcome,
    RejectedExport,
    RunRequest,
    Usage,
)

# Precompiled: the runtime's interpreter is sandcell's own, and compiling the boot on every run
# would cost about 2 ms.
_CONTROL_BOOT = "boot.pyc"
_CONTROL_PLAN = "plan.json"
_CONTROL_DISPLAY = "display.pyc"
# Display outputs go to a directory of the workspace: it outlives the sandbox until the host
# collects it (a tmpfs of bwrap's own would die with the sandbox), it is already capped by the
# workspace quota, and the rootless path reads it through /proc/PID/root like the exports. The
# executor reads it first and removes it, so it is never exported nor seen as a program's file.
_DISPLAY_DIR = f"{SANDBOX_WORKDIR}/{DISPLAY_DIRNAME}"
_MOUNT_HELPER = Path(__file__).with_name("_mount_helper.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Layers:
    """The layers decided for one run (pure data, recorded in the enforcement report)."""

    cgroup_host: cgroups.CgroupHost | None
    landlock_abi: int | None
    rootless: bool

    @property
    def use_helper(self) -> bool:
        """Whether the workspace helper runs the sandbox: always for an ordinary user, who cannot
        mount on the host, and without cgroups, where the helper's reaping measures CPU time."""
        return self.rootless or self.cgroup_host is None


class NamespacesBackend:
    """Runs each program in a fresh bubblewrap sandbox. One instance serves many runs.

    ``warm``: start python runs from a template or a pool of pre-isolated children instead
    (see ``warm.py``); what those cannot serve starts cold, and the record says why.
    """

    name = "namespaces"

    def __init__(self, warm: WarmConfig | None = None) -> None:
        self.bwrap = find_bwrap()
        self.arch = seccomp.native_arch()
        self._seccomp_policy = seccomp.build_policy(self.arch)
        self._seccomp_program = self._seccomp_policy.compile()
        self._cgroup_host = cgroups.detect()
        self._landlock_abi = landlock.probe_abi()
        self.rootless = os.geteuid() != 0
        self.root = workspace.prepare_root()
        self._boot_code = landlock.boot_bytecode()
        self._display_code: bytes | None = None  # compiled on the first run that displays
        sweep()
        self._warm = WarmStarter(self, warm) if warm is not None else None

    # -- 1. layers -------------------------------------------------------------------------

    def _decide(self, request: RunRequest) -> _Layers:
        host: cgroups.CgroupHost | None = None
        if request.mode is IsolationMode.STRICT:
            if isinstance(self._cgroup_host, IsolationUnavailable):
                raise self._cgroup_host
            host = self._cgroup_host
        if request.landlock is True and self._landlock_abi is None:
            raise IsolationUnavailable(
                "landlock",
                "the kernel does not offer Landlock",
                "use a kernel >= 5.13 with Landlock enabled (lsm=...,landlock), or run with "
                "Landlock off",
            )
        abi = None if request.landlock is False else self._landlock_abi
        return _Layers(cgroup_host=host, landlock_abi=abi, rootless=self.rootless)

    def versions(self) -> Mapping[str, str]:
        return {
            "bubblewrap": f"{self.bwrap.version_text} ({self.bwrap.source}: {self.bwrap.path})",
            "kernel": platform.release(),
            "arch": self.arch,
        }

    def close(self) -> None:
        """Nothing is held between cold runs; a warm template and its pool are ended."""
        if self._warm is not None:
            self._warm.close()

    def warm_stats(self) -> WarmStats | None:
        """The template and pool, as they are now (None without warm starts)."""
        return self._warm.stats() if self._warm is not None else None

    # -- the run ---------------------------------------------------------------------------

    def run(self, request: RunRequest, *, run_id: str, collect: Collector) -> BackendResult:
        if self._warm is None:
            return self._run_cold(request, run_id=run_id, collect=collect)
        warm = self._warm.run(request, run_id=run_id, collect=collect)
        if isinstance(warm, BackendResult):
            return warm
        cold = self._run_cold(request, run_id=run_id, collect=collect)
        layers = {**cold.enforcement.layers, "warm_start": f"not used: {warm}"}
        return replace(cold, enforcement=replace(cold.enforcement, layers=layers))

    def _run_cold(self, request: RunRequest, *, run_id: str, collect: Collector) -> BackendResult:
        layers = self._decide(request)
        if layers.cgroup_host is not None:
            threading.Thread(
                target=cgroups.prime_attach, args=(layers.cgroup_host,), daemon=True
            ).start()
        runtime = runtime_for(request.language)
        run_dir = self.root / workspace.owner_tag() / run_id
        cgroup: cgroups.RunCgroup | None = None
        mounted = False
        try:
            # -- 2. run directory ----------------------------------------------------------
            work = run_dir / "work"
            control = run_dir / "control"
            work.mkdir(parents=True, mode=0o700)
            control.mkdir(mode=0o755)
            if not layers.use_helper:
                try:
                    workspace.mount_tmpfs(
                        work,
                        size_bytes=request.effective_limits.workspace_bytes,
                        inodes=request.effective_limits.workspace_inodes,
                        mode=0o755,
                    )
                    mounted = True
                except OSError as exc:
                    raise IsolationUnavailable(
                        "workspace quota",
                        f"could not mount the workspace tmpfs: {exc}",
                        "check that the runs directory (SANDCELL_RUNS) is on a local filesystem",
                    ) from exc
            self._write_control(control, request, runtime, layers)

            # -- 3. cgroup -----------------------------------------------------------------
            if layers.cgroup_host is not None:
                cgroup = cgroups.RunCgroup(layers.cgroup_host, f"{workspace.owner_tag()}.{run_id}")
                cgroup.create(
                    cgroups.plan_settings(
                        layers.cgroup_host.version,
                        memory_bytes=request.effective_limits.memory_bytes,
                        max_pids=request.effective_limits.max_pids,
                        swap_accounting=cgroups.swap_accounting(layers.cgroup_host),
                    )
                )
            rlimit_plan = plan_rlimits(request.effective_limits, request.mode)

            # -- 4. argument list ----------------------------------------------------------
            pipes = Pipes(self._seccomp_program)
            try:
                fds = pipes.fds()
                self._write_plan(control, request, runtime, layers, status_fd=fds.status_w)
                env = {**common_env(), **runtime.env, **request.env}
                argv = build_argv(
                    BwrapPlan(
                        bwrap=self.bwrap.path,
                        ro_dirs=runtime.ro_dirs,
                        symlinks=runtime.symlinks,
                        workspace=work,
                        control_dir=control,
                        etc_dir=self.root / "etc",
                        inputs=[(i.host_path, i.name) for i in request.inputs],
                        packages=request.packages,
                        env=env,
                        tmp_bytes=request.effective_limits.tmp_bytes,
                        seccomp_fd=fds.seccomp,
                        info_fd=fds.info_w,
                        block_fd=fds.block_r,
                        command=self._command(request, runtime),
                    )
                )

                # -- 5. launch -------------------------------------------------------------
                def on_sandbox_pid(pid: int) -> None:
                    if cgroup is not None:
                        cgroup.attach(pid)
                    apply_rlimits(pid, rlimit_plan)

                def on_kill() -> None:
                    if cgroup is not None:
                        cgroup.kill_all()

                helper: HelperChannel | None = None
                collected: list[tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]] = []
                if layers.use_helper:
                    # An ordinary user cannot mount the workspace tmpfs on the host: a helper
                    # mounts it in a namespace of its own and runs bwrap there.
                    helper = HelperChannel()
                    result_w, hold_r = helper.child_fds()
                    argv = [
                        runtime.python,
                        "-I",
                        "-S",
                        str(_MOUNT_HELPER),
                        str(work),
                        str(request.effective_limits.workspace_bytes),
                        str(request.effective_limits.workspace_inodes),
                        str(result_w),
                        str(hold_r),
                        ",".join(map(str, fds.passed())),
                        "--",
                        *argv,
                    ]

                def after_exit(pid: int) -> None:
                    view = Path(f"/proc/{pid}/root{work}") if layers.use_helper else work
                    collected.append(collect(view))

                launched = launch(
                    argv,
                    pipes=pipes,
                    stdin=request.stdin,
                    wall_time_s=request.effective_limits.wall_time_s,
                    stdout_cap=request.effective_limits.stdout_bytes,
                    stderr_cap=request.effective_limits.stderr_bytes,
                    on_sandbox_pid=on_sandbox_pid,
                    on_kill=on_kill,
                    after_exit=after_exit,
                    helper=helper,
                )
            finally:
                pipes.close_all()

            # -- 6. observe, export ---------------------------------------------------------
            cg_usage = cgroup.usage() if cgroup is not None else None
            if cgroup is not None:
                cgroup.kill_all()
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
            artifacts, rejected = collected[0] if collected and launched.started else ((), ())
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
                enforcement=self._enforcement(request, layers),
                reason=reason,
            )
        finally:
            if cgroup is not None:
                cgroup.remove()
            if mounted:
                with contextlib.suppress(OSError):
                    workspace.unmount(work)
            workspace.remove_tree(run_dir)

    # -- helpers ---------------------------------------------------------------------------

    def _command(self, request: RunRequest, runtime: Runtime) -> list[str]:
        boot = [runtime.python, "-I", f"/sandcell/{_CONTROL_BOOT}", f"/sandcell/{_CONTROL_PLAN}"]
        if request.language == "python":
            return [*boot, "python", str(code_path("python"))]
        return [*boot, "exec", runtime.interpreter, str(code_path("bash"))]

    def _write_control(
        self, control: Path, request: RunRequest, runtime: Runtime, layers: _Layers
    ) -> None:
        (control / _CONTROL_BOOT).write_bytes(self._boot_code)
        if _displays(request):
            if self._display_code is None:
                self._display_code = landlock.boot_bytecode(
                    f"{landlock.SANDBOX_DIR}/display.py", script=landlock.DISPLAY_SCRIPT
                )
            (control / _CONTROL_DISPLAY).write_bytes(self._display_code)
        code_file = control / code_path(request.language).name
        code_file.write_text(request.code, encoding="utf-8")
        for p in control.iterdir():
            p.chmod(0o444)

    def _write_plan(
        self,
        control: Path,
        request: RunRequest,
        runtime: Runtime,
        layers: _Layers,
        *,
        status_fd: int,
    ) -> None:
        lplan = None
        if layers.landlock_abi is not None:
            lplan = landlock.build_plan(
                runtime_paths=[
                    *runtime.ro_dirs,
                    *(link for link, _ in runtime.symlinks),
                    *([PACKAGES_DIR] if request.packages else []),
                ],
                input_dir="/inputs" if request.inputs else None,
                work_dir=SANDBOX_WORKDIR,
                abi=layers.landlock_abi,
            )
        plan_text = landlock.boot_plan_json(
            plan=lplan,
            status_fd=status_fd,
            input_links=[(i.name, f"/inputs/{i.name}") for i in request.inputs],
            python_paths=[f"{PACKAGES_DIR}/{p.name}" for p in request.packages],
            display=(_DISPLAY_DIR, f"{landlock.SANDBOX_DIR}/{_CONTROL_DISPLAY}")
            if _displays(request)
            else None,
        )
        path = control / _CONTROL_PLAN
        path.write_text(plan_text)
        path.chmod(0o444)

    def _enforcement(self, request: RunRequest, layers: _Layers) -> Enforcement:
        ll: dict[str, str] = {
            "user_namespace": f"uid {os.geteuid()} mapped to sandbox uid 1000, no capabilities",
            "pid_namespace": "yes",
            "mount_namespace": (
                f"runtime read-only, private /tmp, {SANDBOX_WORKDIR}, inputs read-only"
            ),
            "network_namespace": "empty (loopback only)",
            "ipc_namespace": "yes",
            "uts_namespace": "yes",
            "cgroup_namespace": "yes",
            "no_new_privs": "yes",
            "seccomp": self._seccomp_policy.describe(),
            "rlimits": "cpu, open files, file size, core"
            + (", address space, processes" if request.mode is IsolationMode.RLIMITS else ""),
            "workspace_quota": f"tmpfs of {request.effective_limits.workspace_bytes} bytes",
            "bubblewrap": self.bwrap.version_text,
        }
        weakened: list[str] = []
        if layers.cgroup_host is not None:
            ll["cgroups"] = layers.cgroup_host.describe() + ": memory (no swap), pids, cpu usage"
        else:
            weakened.append("cgroups: memory by RLIMIT_AS, processes by RLIMIT_NPROC")
        if layers.landlock_abi is not None:
            ll["landlock"] = f"ABI {layers.landlock_abi}"
        elif request.landlock is False:
            weakened.append("landlock: disabled by request")
        return Enforcement(
            backend=self.name, layers=ll, mode=request.mode, weakened=tuple(weakened)
        )


def _displays(request: RunRequest) -> bool:
    """Whether the run captures rich outputs (python programs only)."""
    return request.display and request.language == "python"


def _classify(
    launched: Launched, cg: cgroups.CgroupUsage | None, request: RunRequest
) -> tuple[Outcome, str]:
    limits = request.effective_limits
    if not launched.started:
        err = launched.stderr.decode(errors="replace").strip()
        if launched.exit_code == BOOT_FAILED_STATUS:
            return Outcome.INFRA_ERROR, f"the sandbox could not apply an isolation layer: {err}"
        return Outcome.INFRA_ERROR, f"the sandbox did not start the program: {err or 'no output'}"
    if launched.stopped_by == "wall_time":
        return Outcome.TIMEOUT, f"wall-time limit of {limits.wall_time_s:g} s reached"
    if launched.stopped_by in ("stdout", "stderr"):
        cap = limits.stdout_bytes if launched.stopped_by == "stdout" else limits.stderr_bytes
        return Outcome.OUTPUT_LIMIT, f"{launched.stopped_by} exceeded its cap of {cap} bytes"
    if cg is not None and cg.oom_killed:
        return Outcome.MEMORY_LIMIT, f"memory limit of {limits.memory_bytes} bytes reached"
    sig = launched.signal
    if sig in (signal.SIGXCPU, signal.SIGKILL) and _cpu_exhausted(launched, cg, limits.cpu_time_s):
        return Outcome.TIMEOUT, f"CPU-time limit of {limits.cpu_time_s} s reached"
    if sig is not None:
        return Outcome.KILLED, f"killed by signal {sig} ({signal.Signals(sig).name})"
    if (
        request.mode is IsolationMode.RLIMITS
        and launched.exit_code
        and launched.stderr.rstrip().endswith(b"MemoryError")
    ):
        return Outcome.MEMORY_LIMIT, f"address-space limit of {limits.memory_bytes} bytes reached"
    if launched.exit_code == 0:
        return Outcome.OK, "exited with status 0"
    return Outcome.ERROR, f"exited with status {launched.exit_code}"


def _cpu_exhausted(launched: Launched, cg: cgroups.CgroupUsage | None, cpu_s: int) -> bool:
    if launched.signal == signal.SIGXCPU:
        return True
    cpu_ms = cg.cpu_ms if cg and cg.cpu_ms is not None else launched.cpu_ms_rusage
    return cpu_ms >= cpu_s * 1000 * 0.98


def sweep() -> list[str]:
    """Remove what dead supervisors left: run directories, mounts, cgroups. Returns what went."""
    removed = [str(p) for p in workspace.sweep_runs()]
    host = cgroups.detect()
    if isinstance(host, cgroups.CgroupHost):
        for _ctrl, group in cgroups.stale_groups(host):
            owner = group.name.partition(".")[0]
            if workspace.owner_alive(owner):
                continue
            rc = cgroups.RunCgroup(host, group.name)
            rc.dirs = {c: b / group.name for c, b in host.bases.items()}
            rc.kill_all()
            if rc.remove():
                removed.append(str(group))
    return sorted(set(removed))


__all__ = ["NamespacesBackend", "WarmConfig", "WarmStats", "sweep"]
