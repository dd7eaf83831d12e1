"""The default backend: Linux namespaces via bubblewrap, with seccomp, Landlock, cgroups, rlimits.

:meth:`NamespacesBackend.run` reads as the order of containment:

1. decide the layers for this request and fail closed on any that cannot be enforced;
2. lay out the run directory: a size-capped tmpfs workspace and the read-only control files;
3. create the run's cgroup with its limits (on cgroup v1, take one made ahead: ``spare_cgroup.py``,
   with a spawner already inside it that becomes the run's bwrap: ``spawner.py``);
4. build the bwrap argument list (namespaces, mounts, seccomp) as data;
5. launch: the sandbox init (the boot, bwrap's ``--as-pid-1``) is started by a spawner waiting
   in the cgroup (as root; ``spawner.py``), checked to be there and given the run's rlimits
   before it becomes bwrap, so the sandbox starts without waiting for the host (without one,
   the init is held until it is moved in and given its rlimits: an ordinary user's runs under
   the workspace helper); the boot closes inherited descriptors, forks the
   program's process and applies Landlock there;
6. classify how it ended, read usage, export the declared files, and remove everything (once
   every process of the run is dead, on a background thread; :meth:`NamespacesBackend.close`
   waits for it).

Steps 2 to 5 are :class:`~sandcell.backends.namespaces.prepared.PreparedSandbox`'s, which
sessions use as well. A run whose profile reaches outside comes with ``sockets`` (its egress
proxy and tool gateway, ``run_sockets``): every start mode shows them to the program the same
way, and the boot starts the egress bridge before the program (``outside.py``). Each cold run
is registered in :attr:`NamespacesBackend.runs` while it runs, so that
:meth:`NamespacesBackend.cancel_all` can stop it as the wall limit would.

Security limitations: the kernel is shared with the host, so a kernel bug reachable through the
allowed syscalls is an escape; the seccomp allowlist narrows that surface. Host paths of the
runtime (``/usr``, the Python prefix) are visible read-only. Use the gVisor or microVM backends when
a shared kernel is not acceptable.
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.backends.base import BackendResult, Collector, OutputSink, started_cold
from sandcell.backends.host import cgroups, landlock, native_init, node_program, seccomp, workspace
from sandcell.backends.host.bubblewrap import find_bwrap
from sandcell.backends.host.layout import CONTROL_DISPLAY, SANDBOX_WORKDIR, displays
from sandcell.backends.host.observe import observed
from sandcell.backends.host.process import StopPipe
from sandcell.backends.host.runs import RunRegistry
from sandcell.backends.host.sweep import sweep
from sandcell.backends.namespaces import outside
from sandcell.backends.namespaces.launcher import Pipes, launch
from sandcell.backends.namespaces.prepared import (
    SANDBOX_INIT,
    Layers,
    PreparedSandbox,
    boot_command,
)
from sandcell.backends.namespaces.spare_cgroup import SpareCgroup
from sandcell.backends.namespaces.spawner import Spawner, spawner_in
from sandcell.backends.namespaces.warm import WarmStarter
from sandcell.backends.namespaces.warm_teardown import Teardown
from sandcell.backends.warm import WarmConfig, WarmStats
from sandcell.errors import IsolationUnavailable
from sandcell.run_sockets import SandboxSockets
from sandcell.runtimes import Runtime, code_path, runtime_for
from sandcell.spec import (
    Artifact,
    Enforcement,
    IsolationMode,
    Language,
    RejectedExport,
    RunRequest,
)

if TYPE_CHECKING:
    from sandcell.backends.cell import CellSandbox
    from sandcell.backends.cell.state import RestorePoint


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
        self.seccomp_program = self._seccomp_policy.compile()
        """The compiled seccomp filter every sandbox of this backend gets."""
        self._cgroup_host = cgroups.detect()
        self._landlock_abi = landlock.probe_abi()
        self.rootless = os.geteuid() != 0
        self.root = workspace.prepare_root()
        # Precompiled: the runtime's interpreter is sandcell's own, and compiling the boot on
        # every run would cost about 2 ms.
        self.boot_code = landlock.boot_bytecode()
        self.native_init = native_init.build(self.root)
        """The cold sandbox's pid 1 in C (``inside/_init.c``), or None: the boot forks a Python
        supervisor instead (no C compiler, or ``SANDCELL_NATIVE_INIT=0``)."""
        self._display_code: bytes | None = None  # compiled on the first run that displays
        self.runs = RunRegistry()
        """The runs in flight, for :meth:`cancel_all`; warm starts register theirs here too."""
        self._teardown = Teardown()
        """Removes a cold run's directory, mount and cgroup after its result is complete."""
        self._spare_cgroup = (
            SpareCgroup(
                self._cgroup_host,
                # As root bwrap is started directly: a spawner can wait for it in the group.
                # An ordinary user's runs start under the workspace helper instead.
                spawner=None if self.rootless else self._spawner,
            )
            if isinstance(self._cgroup_host, cgroups.CgroupHost)
            and SpareCgroup.usable(self._cgroup_host)
            else None
        )
        """The next cold run's cgroup, made ahead with a spawner in it (``spare_cgroup.py``,
        ``spawner.py``)."""
        sweep()
        self._warm = WarmStarter(self, warm) if warm is not None else None

    # -- 1. layers -------------------------------------------------------------------------

    def decide(self, request: RunRequest) -> Layers:
        """The layers for ``request``; raises IsolationUnavailable for one the host lacks."""
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
        return Layers(cgroup_host=host, landlock_abi=abi, rootless=self.rootless)

    def versions(self) -> Mapping[str, str]:
        return {
            "bubblewrap": f"{self.bwrap.version_text} ({self.bwrap.source}: {self.bwrap.path})",
            "kernel": platform.release(),
            "arch": self.arch,
        }

    def wait_idle(self) -> None:
        """Return once every finished run's sandbox is gone (their teardown runs in the
        background after the result); runs in flight are not waited for."""
        self._teardown.drain()

    def close(self) -> None:
        """A warm template and its pool are ended; returns once every run's sandbox is gone."""
        if self._warm is not None:
            self._warm.close()
        self._teardown.drain()
        if self._spare_cgroup is not None:
            self._spare_cgroup.close()

    def cancel_all(self, reason: str) -> int:
        """Stop every run in flight; each ends ``killed``, its reason starting "cancelled: "
        followed by ``reason``. Returns how many runs were told to stop."""
        return self.runs.cancel_all(reason)

    def cancel(self, run_id: str, reason: str) -> bool:
        """Stop the run ``run_id`` if it is in flight, as :meth:`cancel_all` would."""
        return self.runs.cancel(run_id, reason)

    def warm_stats(self) -> WarmStats | None:
        """The template and pool, as they are now (None without warm starts)."""
        return self._warm.stats() if self._warm is not None else None

    def session_sandbox(
        self,
        request: RunRequest,
        *,
        session_id: str,
        sockets: SandboxSockets | None = None,
        restore: RestorePoint | None = None,
    ) -> CellSandbox:
        """A live sandbox for one session (not started yet; see ``session.py``)."""
        from sandcell.backends.namespaces.session import SessionSandbox

        return SessionSandbox(
            self, request, session_id=session_id, sockets=sockets, restore=restore
        )

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
        if self._warm is None:
            return self._run_cold(
                request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
            )
        warm = self._warm.run(
            request, run_id=run_id, collect=collect, sockets=sockets, on_output=on_output
        )
        if isinstance(warm, BackendResult):
            return warm
        # Nothing ran warm, so on_output was told nothing yet.
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
        sockets: SandboxSockets | None = None,
        on_output: OutputSink | None = None,
    ) -> BackendResult:
        layers = self.decide(request)
        sandbox = PreparedSandbox(self, request, name=run_id, layers=layers, sockets=sockets)
        try:
            # -- 2. run directory, 3. cgroup -------------------------------------------------
            spare = self._spare_cgroup if layers.cgroup_host is not None else None
            command = self._command(request, sandbox.runtime)
            taken = (
                spare.take_ready(
                    request.effective_limits,
                    f"{workspace.owner_tag()}.{run_id}",
                    command=None if layers.use_helper else command,
                )
                if spare is not None
                else None
            )
            spawner = taken.spawner if taken is not None else None
            if layers.cgroup_host is not None and spawner is None:
                # The sandbox will be moved into its group: start the kernel's wait for that
                # now (a spawner's group needs no move, and the wait would stall forks).
                threading.Thread(
                    target=cgroups.prime_attach, args=(layers.cgroup_host,), daemon=True
                ).start()
            try:
                sandbox.create(self._control_files(request), cgroup=taken.group if taken else None)
                if (
                    spawner is None
                    and sandbox.cgroup is not None
                    and not self.rootless
                    and not layers.use_helper
                ):
                    # No spare waiting: bwrap is still born in the run's group (spawner.py).
                    spawner = spawner_in(
                        sandbox.cgroup,
                        bwrap=self.bwrap.path,
                        seccomp_program=self.seccomp_program,
                        command=command,
                        max_pids=request.effective_limits.max_pids,
                    )
            except BaseException:
                if spawner is not None:
                    spawner.discard()
                raise

            # -- 4. argument list ----------------------------------------------------------
            pipes = spawner.pipes if spawner is not None else Pipes(self.seccomp_program)
            sandbox.born_in_cgroup = spawner is not None
            # A spawner in the group, given the rlimits now, starts a sandbox that needs no
            # hold: the host's read of the init's pid and the unblock leave the sandbox's path.
            held = spawner is None or not sandbox.limit_ahead(spawner.pid)
            started: list[bool] = []

            def start(argv: list[str], stdin: bytes) -> subprocess.Popen[bytes]:
                assert spawner is not None
                proc = spawner.start(argv, stdin)
                started.append(True)
                return proc

            stop = StopPipe()
            collected: list[tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]] = []
            try:
                # The boot is pid 1: it reaps every process of the run and reports the
                # program's status, so bwrap's own reaper would only add a process.
                argv = sandbox.argv(command, pipes.fds(), as_pid_1=True, held=held)

                def after_exit(pid: int) -> None:
                    collected.append(collect(sandbox.workspace_view(pid)))

                def on_sandbox_pid(pid: int) -> None:
                    sandbox.on_sandbox_pid(pid)
                    if spare is not None:
                        spare.refill()  # now: the run's own preparation is done

                # -- 5. launch, cancellable ------------------------------------------------
                with self.runs.register(run_id, stop.set) as cancellation:
                    launched = launch(
                        argv,
                        pipes=pipes,
                        stdin=request.stdin,
                        wall_time_s=request.effective_limits.wall_time_s,
                        stdout_cap=request.effective_limits.stdout_bytes,
                        stderr_cap=request.effective_limits.stderr_bytes,
                        on_sandbox_pid=on_sandbox_pid,
                        on_kill=sandbox.kill_all,
                        after_exit=after_exit,
                        helper=sandbox.helper,
                        stop=stop,
                        start=start if spawner is not None else None,
                        on_output=on_output,
                        held=held,
                    )
            finally:
                if spawner is not None and not started:
                    spawner.discard()  # nothing started: it exits, and is reaped there
                pipes.close_all()
                stop.close()

            # -- 6. observe, export ---------------------------------------------------------
            cg_usage = sandbox.usage()
            sandbox.kill_all()
            artifacts, rejected = collected[0] if collected and launched.started else ((), ())
            return observed(
                launched,
                cg_usage,
                request,
                cancel_reason=cancellation.reason,
                artifacts=artifacts,
                rejected=rejected,
                enforcement=self.enforcement(request, layers, sockets),
                heap_limit_bytes=self.heap_limit(request),
            )
        finally:
            if self._spare_cgroup is not None:
                self._spare_cgroup.refill()  # also when the run failed before its start
            # Every process of the run is dead (the sandbox's pid 1 was reaped) and the exports
            # are read: what is left is host bookkeeping, removed off the result path.
            self._teardown.submit(sandbox.remove)

    # -- helpers ---------------------------------------------------------------------------

    def _spawner(self) -> Spawner:
        """A spawner for the next cold python run (most are: a bash run ends the spawner and
        starts bwrap itself).

        Made for the default runtime, it serves every runtime: its command names only the
        neutral interpreter path, the same in each, and the runtime's mounts reach bwrap through
        the arguments memfd at run time. A run whose command differs ends it
        (``SpareCgroup.take_ready``) and starts bwrap itself."""
        runtime = runtime_for("python")
        return Spawner(self.bwrap.path, self.seccomp_program, self._command_for("python", runtime))

    def _command(self, request: RunRequest, runtime: Runtime) -> list[str]:
        args = node_program.program_args(
            request.language, runtime.interpreter_args, request.effective_limits, request.mode
        )
        return self._command_for(request.language, replace(runtime, interpreter_args=args))

    def _command_for(self, language: Language, runtime: Runtime) -> list[str]:
        if language == "python":
            boot = boot_command(runtime.sandbox_python, "python", str(code_path("python")))
        else:
            boot = boot_command(
                runtime.sandbox_python,
                "exec",
                runtime.sandbox_interpreter,
                *runtime.interpreter_args,
                str(code_path(language)),
            )
        # The native init as pid 1 above the boot: no Python fork per run (``_init.c``).
        return boot if self.native_init is None else [SANDBOX_INIT, *boot]

    def heap_limit(self, request: RunRequest) -> int | None:
        """A memory maximum the program meets inside the sandbox, below the cgroup's (None
        here; the wasm rung's Wasm heap)."""
        return None

    def _control_files(self, request: RunRequest) -> dict[str, bytes]:
        files = {code_path(request.language).name: request.code.encode("utf-8")}
        if displays(request):
            if self._display_code is None:
                self._display_code = landlock.boot_bytecode(
                    f"{landlock.SANDBOX_DIR}/display.py", script=landlock.DISPLAY_SCRIPT
                )
            files[CONTROL_DISPLAY] = self._display_code
        return files

    def enforcement(
        self, request: RunRequest, layers: Layers, sockets: SandboxSockets | None = None
    ) -> Enforcement:
        """The enforcement report of a sandbox with ``layers`` (what is active, what is weaker),
        reaching ``sockets`` (the run's egress proxy and tool gateway) when given."""
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
        ll.update(
            outside.layers(
                sockets, landlock_abi=layers.landlock_abi, cgroup=layers.cgroup_host is not None
            )
        )
        ll.update(node_program.layers(request.language, request.mode))
        return Enforcement(
            backend=self.name, layers=ll, mode=request.mode, weakened=tuple(weakened)
        )


def sweep_stale() -> list[str]:
    """What dead supervisors left on the host (run directories, mounts, cgroups), without a
    backend (the registry's sweep, for ``sandcell session``): the host's :func:`sweep`."""
    return sweep()


__all__ = ["NamespacesBackend", "WarmConfig", "WarmStats", "sweep", "sweep_stale"]
