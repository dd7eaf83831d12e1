"""The host side of one sandbox: run directory, control files, cgroup, bwrap argument list.

Both a one-shot cold run (:meth:`NamespacesBackend.run`) and a session's long-lived sandbox
(:mod:`sandcell.backends.namespaces.session`) are built by :class:`PreparedSandbox`, in this order:

1. the layers were decided by the backend (``NamespacesBackend.decide``), failing closed;
2. :meth:`~PreparedSandbox.create`: the run directory, its size-capped workspace tmpfs (as root;
   an ordinary user's is mounted by the workspace helper), the read-only control files, and the
   run's cgroup with its limits;
3. :meth:`~PreparedSandbox.argv`: the boot plan (Landlock rules, status descriptor) and the bwrap
   argument list for the launch descriptors, wrapped in the workspace helper where one is needed;
   every read-only host source is bound from a read-only overlay of it (``neutral_sources``:
   mounted here as root, by the helper in its namespace otherwise), so that the sandbox's
   mountinfo names no host path; a run that reaches outside (``sockets``) gets its socket
   directory bound, its environment, ``sys.path`` and Landlock port rule, and its egress bridge
   in the boot plan (``outside.py``);
4. once bwrap reports the sandbox init, :meth:`~PreparedSandbox.on_sandbox_pid` moves it into the
   cgroup and sets its rlimits, before it starts anything;
5. :meth:`~PreparedSandbox.remove` ends what is left: cgroup, mount, directory.

Starting and supervising the processes is the caller's (``launcher.launch`` for a run, the
session's keeper for a session).

Security limitations: those of the namespaces backend (a shared kernel). Files written here are
read-only inside the sandbox, but the host's root can still change them while it runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.host import cgroups, landlock, neutral_sources, node_program, workspace
from sandcell.backends.host import native_init as native_init_build
from sandcell.backends.host.layout import (
    CONTROL_BOOT,
    CONTROL_DIR,
    CONTROL_DISPLAY,
    CONTROL_INIT,
    CONTROL_PLAN,
    DISPLAY_DIR,
    PACKAGES_DIR,
    SANDBOX_WORKDIR,
    displays,
)
from sandcell.backends.host.process import HelperChannel
from sandcell.backends.host.rlimits import apply_rlimits, plan_rlimits
from sandcell.backends.host.runtime_mounts import support_files
from sandcell.backends.namespaces import outside
from sandcell.backends.namespaces.bwrap import BwrapPlan, args_via_fd, build_argv
from sandcell.backends.namespaces.launcher import LaunchFds
from sandcell.backends.namespaces.spawner import in_cgroup
from sandcell.errors import InfraError, IsolationUnavailable
from sandcell.run_sockets import SandboxSockets
from sandcell.runtimes import Runtime, common_env, runtime_for
from sandcell.spec import RunRequest

if TYPE_CHECKING:
    from sandcell.backends.namespaces import NamespacesBackend

_MOUNT_HELPER = workspace.MOUNT_HELPER


@dataclass(frozen=True, slots=True, kw_only=True)
class Layers:
    """The layers decided for one sandbox (pure data, recorded in the enforcement report)."""

    cgroup_host: cgroups.CgroupHost | None
    landlock_abi: int | None
    rootless: bool

    @property
    def use_helper(self) -> bool:
        """Whether the workspace helper runs the sandbox: always for an ordinary user, who cannot
        mount on the host, and without cgroups, where the helper's reaping measures CPU time."""
        return self.rootless or self.cgroup_host is None


SANDBOX_INIT = f"{CONTROL_DIR}/{CONTROL_INIT}"
"""The native init in the sandbox: a command starting with it gets it linked in (see
:meth:`PreparedSandbox.argv`)."""


def boot_command(python: str, mode: str, *target: str) -> list[str]:
    """The sandbox's command: the boot, which isolates and then runs ``target`` (``mode`` is
    ``"python"`` for a script, ``"exec"`` for a program)."""
    boot = [python, "-I", f"{CONTROL_DIR}/{CONTROL_BOOT}", f"{CONTROL_DIR}/{CONTROL_PLAN}"]
    return [*boot, mode, *target]


class PreparedSandbox:
    """One sandbox's host-side state, from its run directory to its argument list (see module).

    Not thread-safe; ``remove`` may be called at any step, and more than once.
    """

    def __init__(
        self,
        backend: NamespacesBackend,
        request: RunRequest,
        *,
        name: str,
        layers: Layers,
        sockets: SandboxSockets | None = None,
    ) -> None:
        self.backend = backend
        self.request = request
        self.sockets = sockets
        """The run's ways out (``outside.py``): bound, in the environment and the plan."""
        self.layers = layers
        self.limits = request.effective_limits
        self.runtime: Runtime = runtime_for(request.language, request.runtime)
        self.name = name
        self.run_dir = backend.root / workspace.owner_tag() / name
        self.work = self.run_dir / "work"
        self.control = self.run_dir / "control"
        self.cgroup: cgroups.RunCgroup | None = None
        self.mounted = False
        self.helper: HelperChannel | None = None
        """The workspace helper's pipes, once :meth:`argv` decided that one runs the sandbox."""
        self._rlimits = plan_rlimits(
            self.limits,
            request.mode,
            address_space=backend.heap_limit(request) is None,
            reserve=node_program.address_reserve(request.language),
        )
        self._written: list[Path] = []
        """The control files written here, removed by name (see :meth:`remove`)."""
        self.view = self.run_dir / "view"
        self._sources = neutral_sources.NeutralSources()
        self._view_mounts: list[str] = []
        """Overlays this supervisor mounted on the host (as root, without the helper)."""
        self._limited_ahead = False
        """Set by :meth:`limit_ahead`: the cgroup and rlimits were in place before bwrap."""
        self.born_in_cgroup = False
        """Set when bwrap starts inside :attr:`cgroup` (a spawner made ahead): the sandbox init
        is then checked to be in it rather than moved there."""

    # -- 2. run directory, control files, cgroup ---------------------------------------------

    def create(
        self,
        files: Mapping[str, bytes],
        *,
        cgroup: cgroups.RunCgroup | None = None,
        freezer: bool = False,
    ) -> None:
        """Lay out the run directory with the boot and ``files`` (name → bytes) as control
        files, and create the cgroup (or take ``cgroup``, empty and limited already, made
        ahead for this run); ``freezer``: one the caller can freeze, where the host has a v1
        freezer (a session, to save its workspace while it goes on). Raises
        IsolationUnavailable when the workspace quota cannot be set up."""
        # Ours from here: remove() ends it whatever fails below.
        self.cgroup = cgroup
        self.work.mkdir(parents=True, mode=0o700)
        self.control.mkdir(mode=0o755)
        if not self.layers.use_helper:
            try:
                workspace.mount_tmpfs(
                    self.work,
                    size_bytes=self.limits.workspace_bytes,
                    inodes=self.limits.workspace_inodes,
                    mode=0o755,
                )
                self.mounted = True
            except OSError as exc:
                raise IsolationUnavailable(
                    "workspace quota",
                    f"could not mount the workspace tmpfs: {exc}",
                    "check that the runs directory (SANDCELL_RUNS) is on a local filesystem",
                ) from exc
        for fname, data in {CONTROL_BOOT: self.backend.boot_code, **files}.items():
            path = self.control / fname
            self._written.append(path)
            path.write_bytes(data)
            path.chmod(0o444)
        host = self.layers.cgroup_host
        if host is not None and self.cgroup is None:
            self.cgroup = cgroups.RunCgroup(
                host, f"{workspace.owner_tag()}.{self.name}", freezer=freezer
            )
            self.cgroup.create(
                cgroups.plan_settings(
                    host.version,
                    memory_bytes=self.limits.memory_bytes,
                    max_pids=self.limits.max_pids,
                    swap_accounting=cgroups.swap_accounting(host),
                )
            )

    # -- 3. boot plan and argument list ------------------------------------------------------

    def argv(
        self,
        command: Sequence[str],
        fds: LaunchFds,
        *,
        as_pid_1: bool = False,
        held: bool = True,
    ) -> list[str]:
        """Write the boot plan and return the argument list that starts the sandbox with
        ``command`` inside: bwrap's, or the workspace helper's that runs bwrap (then
        :attr:`helper` holds the helper's pipes, to pass to the launch). ``as_pid_1``: the
        command is the sandbox's pid 1 (it must reap every child, as the boot does).
        ``held=False``: no ``--block-fd`` (only after :meth:`limit_ahead` returned True)."""
        native_init = bool(command) and command[0] == SANDBOX_INIT
        if native_init:
            self._link_init()
        supervised = self._write_plan(status_fd=fds.status_w, native_init=native_init)
        request, runtime = self.request, self.runtime
        etc_dir = self.backend.root / "etc"
        files = support_files(self.backend.root, runtime)
        src = self._plan_sources(etc_dir, files)
        argv = build_argv(
            BwrapPlan(
                bwrap=self.backend.bwrap.path,
                ro_dirs=(),
                mounts=[(src.of(host), dest) for host, dest in runtime.mounts],
                files=[(Path(src.of(host)), dest) for host, dest in files],
                symlinks=runtime.symlinks,
                workspace=self.work,
                control_dir=Path(src.of(self.control)),
                etc_dir=Path(src.of(etc_dir)),
                inputs=[(Path(src.of(i.host_path)), i.name) for i in request.inputs],
                packages=[Path(src.of(p)) for p in request.packages],
                # Bound as it is: a socket behind an overlay refuses connections.
                sockets_dir=self.sockets.host_dir if self.sockets is not None else None,
                env={
                    **outside.program_env(
                        {**common_env(), **runtime.sandbox_env}, self.sockets, request.env
                    ),
                    # For the init alone: it takes it out of the program's environment.
                    **({native_init_build.STATUS_ENV: str(fds.status_w)} if supervised else {}),
                },
                tmp_bytes=self.limits.tmp_bytes,
                seccomp_fd=fds.seccomp,
                info_fd=fds.info_w,
                block_fd=fds.block_r if held else None,
                command=list(command),
                as_pid_1=as_pid_1,
            )
        )
        if fds.args is not None:
            argv, data = args_via_fd(argv, fds.args)
            os.pwrite(fds.args, data, 0)
        if not self.layers.use_helper:
            self._view_mounts = neutral_sources.mount_all(src)
            return argv
        # An ordinary user cannot mount the workspace tmpfs on the host: a helper mounts it in a
        # namespace of its own (and the overlays of the neutral sources) and runs bwrap there.
        for d in src.directories:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o755)
        self.helper = HelperChannel()
        result_w, hold_r = self.helper.child_fds()
        return [
            runtime.python,
            "-I",
            "-S",
            str(_MOUNT_HELPER),
            str(self.work),
            str(self.limits.workspace_bytes),
            str(self.limits.workspace_inodes),
            str(result_w),
            str(hold_r),
            ",".join(map(str, fds.passed())),
            *neutral_sources.helper_args(src),
            "--",
            *argv,
        ]

    def _plan_sources(
        self, etc_dir: Path, files: Sequence[tuple[Path, str]]
    ) -> neutral_sources.NeutralSources:
        """The overlays that serve this sandbox's read-only host sources (``neutral_sources``):
        everything but the workspace (a tmpfs already) and what is bound at its own path."""
        runtime, request = self.runtime, self.request
        moved, layers = neutral_sources.runtime_sources(
            runtime.mounts, etc_dir, runtime.prebuilt_bytecode
        )
        paths = neutral_sources.gather(
            [
                self.control,
                etc_dir,
                *moved,
                *(host for host, _ in files),
                *(i.host_path for i in request.inputs),
                *request.packages,
            ]
        )
        self._sources = neutral_sources.plan(paths, str(self.view), layers=layers)
        return self._sources

    def _link_init(self) -> None:
        """The backend's native init (``host/native_init.py``) in the control directory: a hard
        link, it lies on the same filesystem (a copy where it cannot be linked)."""
        built = self.backend.native_init
        if built is None:
            raise InfraError("the sandbox command names the native init, which was not built")
        path = self.control / CONTROL_INIT
        self._written.append(path)
        try:
            os.link(built, path)
        except OSError:
            shutil.copyfile(built, path)
            path.chmod(0o555)

    def _write_plan(self, *, status_fd: int, native_init: bool = False) -> bool:
        """Write the boot plan; True when the native init supervises the program (the init is
        pid 1 and the boot starts no bridge nor ingress agent, which must be pid 1's children:
        then the init becomes the boot)."""
        request, runtime = self.request, self.runtime
        lplan = None
        if self.layers.landlock_abi is not None:
            readable, ports = outside.landlock_extras(self.sockets)
            lplan = landlock.build_plan(
                runtime_paths=[
                    *runtime.sandbox_paths,
                    *([PACKAGES_DIR] if request.packages else []),
                ],
                input_dir="/inputs" if request.inputs else None,
                work_dir=SANDBOX_WORKDIR,
                abi=self.layers.landlock_abi,
                extra_read_only=readable,
                connect_tcp_ports=ports,
                serve_tcp_ports=outside.serve_ports(self.sockets),
            )
        bridge = outside.bridge_script(self.sockets)
        ingress = outside.ingress_script(self.sockets)
        supervised = native_init and bridge is None and ingress is None
        plan_text = landlock.boot_plan_json(
            plan=lplan,
            status_fd=status_fd,
            input_links=[(i.name, f"/inputs/{i.name}") for i in request.inputs],
            python_paths=[
                *(f"{PACKAGES_DIR}/{p.name}" for p in request.packages),
                *outside.python_paths(self.sockets),
            ],
            display=(DISPLAY_DIR, f"{CONTROL_DIR}/{CONTROL_DISPLAY}")
            if displays(request)
            else None,
            bridge=bridge,
            ingress=ingress,
            supervised=supervised,
        )
        path = self.control / CONTROL_PLAN
        path.write_text(plan_text)
        path.chmod(0o444)
        return supervised

    # -- 4. the live sandbox -----------------------------------------------------------------

    def limit_ahead(self, spawner_pid: int) -> bool:
        """Before a spawner (``spawner.py``) becomes this sandbox's bwrap: check that it is in
        :attr:`cgroup` and give it the rlimits, which bwrap and every process of the sandbox
        then inherit, so bwrap need not hold the sandbox for :meth:`on_sandbox_pid`. False,
        changing nothing, when it is not in the group (the sandbox is then held and moved in
        as before)."""
        if self.cgroup is None or not in_cgroup(spawner_pid, self.cgroup.dirs):
            return False
        apply_rlimits(spawner_pid, self._rlimits)
        self._limited_ahead = True
        return True

    def on_sandbox_pid(self, pid: int) -> None:
        """Move the (still blocked) sandbox init into the cgroup and give it the rlimits
        (nothing to do when both were given ahead: :meth:`limit_ahead`)."""
        if self._limited_ahead:
            return
        if self.cgroup is not None and not (
            self.born_in_cgroup and in_cgroup(pid, self.cgroup.dirs)
        ):
            self.cgroup.attach(pid)
        apply_rlimits(pid, self._rlimits)

    def kill_all(self) -> None:
        """Kill every process in the cgroup (without cgroups, the caller kills the init)."""
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def usage(self) -> cgroups.CgroupUsage | None:
        return self.cgroup.usage() if self.cgroup is not None else None

    def workspace_view(self, helper_pid: int | None) -> Path:
        """The workspace as the host can read it: through the workspace helper's mount
        namespace (``helper_pid``) when one holds the workspace."""
        if self.layers.use_helper and helper_pid is not None:
            return Path(f"/proc/{helper_pid}/root{self.work}")
        return self.work

    # -- 5. the end --------------------------------------------------------------------------

    def remove(self) -> None:
        """Remove the cgroup (it kills what is still in it), the workspace mount, the directory."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.mounted:
            with contextlib.suppress(OSError):
                workspace.unmount(self.work)
            self.mounted = False
        neutral_sources.unmount_all(self._view_mounts)
        self._view_mounts = []
        # By name, without listing a directory: removal may run on a background thread, and a
        # listing holds a descriptor that a caller counting its own would see. Anything else
        # found there (a directory not empty, a mount left) goes the thorough way.
        try:
            for path in (*self._written, self.control / CONTROL_PLAN):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            views: list[str | Path] = [*reversed(self._sources.directories), self.view]
            for d in views:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(d)
            for d in (self.control, self.work, self.run_dir):
                with contextlib.suppress(FileNotFoundError):
                    d.rmdir()
        except OSError:
            workspace.remove_tree(self.run_dir)


__all__ = [
    "CONTROL_BOOT",
    "CONTROL_DIR",
    "CONTROL_DISPLAY",
    "CONTROL_PLAN",
    "DISPLAY_DIR",
    "Layers",
    "PreparedSandbox",
    "boot_command",
    "displays",
]
