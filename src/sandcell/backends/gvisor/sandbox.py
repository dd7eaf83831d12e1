"""One gVisor sandbox on the host: bundle, workspace, cgroup, the runsc process, and its removal.

The steps, in order (a cold run takes them back to back, a pooled sandbox stops after 3 until a
run takes it):

1. :meth:`GSandbox.create`: the run directory (the namespaces backend's layout and sweep), a
   size-capped tmpfs workspace (as root on the host; an ordinary user's in the workspace helper's
   own mount namespace), the read-only control directory (agent, boot, display module), an empty
   read-only root of mount points, ``config.json`` (:mod:`.plan`), and the run's cgroup; a
   run that reaches outside (and every pooled sandbox) also gets its socket view, filled by
   :meth:`GSandbox.attach_sockets` before the start (cold) or when a run takes it (pooled);
2. :meth:`GSandbox.spawn`: ``runsc run`` with pipes for stdio and an empty environment. As root
   a one-line shell moves itself into the cgroup and execs runsc, so runsc, its gofer and the
   sentry are all inside before anything starts; an ordinary user's runsc runs in the helper;
3. the agent inside imports its preload and reports ready;
4. :meth:`GSandbox.deliver`: the program and its boot plan go into the control directory, the
   cgroup and workspace get the request's sizes, and the request goes down stdin;
5. supervision (:mod:`.supervise`), then :meth:`GSandbox.destroy`: kill what is left (cgroup or
   process tree), reap, ``runsc delete --force`` if runsc left state, remove the cgroup, the
   mount and the directory.

The sentry writes the sandbox's mountinfo itself (no host path in it). The runtime's bytecode,
which names the host paths it was compiled from, is served like the namespaces backend's: each
runtime directory with bytecode is bound from a read-only overlay with its neutral bytecode tree
on top (``neutral_sources``; mounted on the host as root, in the workspace helper otherwise).
The runtime is the request's (``RunRequest.runtime``, a pooled sandbox's ``WarmConfig.runtime``):
a built runtime's site-packages is bound as it is, its bytecode compiled for the sandbox's paths.

Security limitations: the sandbox's file access goes through runsc's gofer, which runs on the
host (in runsc's own namespaces and seccomp filter); the host's root can change the bundle while
it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shlex
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.gvisor import plan as bundle_plan
from sandcell.backends.gvisor import proctree, runsc
from sandcell.backends.host import cgroups, landlock, neutral_sources, node_program, workspace
from sandcell.backends.host.layout import (
    CONTROL_DIR,
    CONTROL_DISPLAY,
    CONTROL_PLAN,
    DISPLAY_DIR,
    PACKAGES_DIR,
    SANDBOX_GID,
    SANDBOX_UID,
    displays,
)
from sandcell.backends.host.process import HelperChannel, reap
from sandcell.backends.host.runtime_mounts import support_files
from sandcell.backends.host.warm_runtime import runtime_name
from sandcell.errors import InfraError, IsolationUnavailable
from sandcell.run_sockets import (
    BRIDGE_FILE,
    EGRESS_SOCKET,
    INGRESS_FILE,
    INGRESS_SOCKET,
    SANDBOX_LIB,
    TOOLS_FILE,
    TOOLS_SOCKET,
    SandboxSockets,
)
from sandcell.runtimes import Runtime, code_path, common_env, python_runtime, runtime_for
from sandcell.spec import NODE_LANGUAGES, InputFile, Language, Limits, RunRequest

CONTROL_AGENT = "agent.pyc"
CONTROL_BOOT = "boot.pyc"
CONTROL_SECCOMP = "seccomp.bpf"
AGENT_SCRIPT = Path(__file__).with_name("_agent.py")
SETPRIV = shutil.which("setpriv")
MOUNT_HELPER = workspace.MOUNT_HELPER
"""The namespaces backend's workspace helper: it runs rootless runsc the way it runs bwrap."""
_MS_REMOUNT = 0x20
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
PIDS_OVERHEAD = 1024
PIDS_PER_TASK = 32
"""The pids cgroup is a backstop for the host, sized for gVisor's own threads (about 34 for an
idle python) and, on the ptrace platform, a dozen or more host threads per program task (a stub
thread per address space and sentry thread; measured: 64 forked sleepers took over 768): a tight one
makes the sentry itself fail (a run ending with status 2 and no output). The program's own
count is RLIMIT_NPROC inside the sentry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """What every sandbox of one backend shares (decided once, at the backend's start)."""

    runsc: runsc.Runsc
    root: Path
    """The runs root (the namespaces backend's: same layout, same sweep)."""
    cgroup_host: cgroups.CgroupHost | None
    agent_code: bytes
    boot_code: bytes
    display_code: bytes
    seccomp_program: bytes
    """The namespaces backend's compiled seccomp filter, installed by the agent in the sentry."""

    @property
    def sandbox_uid(self) -> int:
        # Rootless, runsc's gofer can create files only as the user it runs as, which the
        # sentry sees as uid 0: a program of any other uid cannot write its workspace.
        return 0 if self.runsc.rootless else SANDBOX_UID


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixed:
    """What is fixed when the sandbox is created: its mounts, sizes and rlimit ceilings."""

    inputs: tuple[InputFile, ...] = ()
    packages: tuple[Path, ...] = ()
    tmp_bytes: int
    workspace_bytes: int
    workspace_inodes: int
    rlimits: tuple[bundle_plan.Rlimit, ...]
    env: Mapping[str, str]
    memory_bytes: int | None
    """The cgroup's memory limit (None without a cgroup)."""
    max_pids: int
    sockets: bool = False
    """The sandbox shows its socket view at ``/run/sandcell`` and may connect to the host Unix
    sockets there (see :meth:`GSandbox.attach_sockets`)."""
    sockets_later: bool = False
    """The view is filled when a run takes the sandbox (a pooled one; see ``plan.py``)."""
    runtime: str | None = None
    """The runtime the sandbox mounts and boots (``RunRequest.runtime``; None: ``default``)."""
    language: Language = "python"
    """The language of the runtime it mounts: a JavaScript or TypeScript program's sandbox
    mounts the Node runtime (Node and its packages, beside the Python runtime of the boot)."""


def fixed_for(request: RunRequest, host: Host, sockets: SandboxSockets | None = None) -> Fixed:
    """A cold sandbox made for exactly ``request`` (and its ways out, if any)."""
    limits = request.effective_limits
    rt = runtime_for(request.language, request.runtime)
    if sockets is not None:
        _refuse_other_sockets([i.host_path for i in request.inputs] + list(request.packages))
    return Fixed(
        inputs=request.inputs,
        packages=request.packages,
        tmp_bytes=limits.tmp_bytes,
        workspace_bytes=limits.workspace_bytes,
        workspace_inodes=limits.workspace_inodes,
        rlimits=bundle_plan.plan_rlimits(
            limits, request.mode, reserve=node_program.address_reserve(request.language)
        ),
        env={**common_env(), **rt.sandbox_env, **request.env},
        memory_bytes=limits.memory_bytes if host.cgroup_host is not None else None,
        max_pids=limits.max_pids,
        sockets=sockets is not None,
        runtime=request.runtime,
        language=request.language,
    )


def fixed_for_pool(host: Host, runtime: str | None = None) -> Fixed:
    """A pooled sandbox of ``runtime``: default sizes, rlimit ceilings the agent lowers per
    request, and an empty socket view that a run reaching outside fills when it takes the
    sandbox (where this runsc can connect to host sockets at all)."""
    limits = Limits()
    py = python_runtime(runtime)
    return Fixed(
        tmp_bytes=limits.tmp_bytes,
        workspace_bytes=limits.workspace_bytes,
        workspace_inodes=limits.workspace_inodes,
        rlimits=bundle_plan.pool_rlimits(),
        env={**common_env(), **py.sandbox_env},
        memory_bytes=limits.memory_bytes if host.cgroup_host is not None else None,
        max_pids=limits.max_pids,
        sockets=host.runsc.host_uds,
        sockets_later=True,
        runtime=runtime,
    )


def _refuse_other_sockets(paths: list[Path]) -> None:
    """Fail closed when an input or package holds a host Unix socket: a sandbox that may
    connect to host sockets must see none but its run's own."""
    found: list[Path] = []
    for top in paths:
        found.append(top)
        for dirpath, dirs, names in os.walk(top):
            found += [Path(dirpath, name) for name in (*dirs, *names)]
    for path in found:
        try:
            is_socket = stat.S_ISSOCK(path.lstat().st_mode)
        except OSError:
            continue
        if is_socket:
            raise IsolationUnavailable(
                "run sockets",
                f"{path} is a Unix socket inside an input or package; the gVisor sandbox of a "
                "run that reaches outside may connect to every host socket it sees",
                "remove the socket from the input or package directory",
            )


def request_line(request: RunRequest, host: Host, sockets: SandboxSockets | None = None) -> bytes:
    """The JSON line the agent reads: environment, rlimits, the boot's command line, and the
    egress bridge to start first (if any)."""
    rt = runtime_for(request.language, request.runtime)
    limits = request.effective_limits
    boot = [f"{CONTROL_DIR}/{CONTROL_BOOT}", f"{CONTROL_DIR}/{CONTROL_PLAN}"]
    if request.language == "python":
        argv = [*boot, "python", str(code_path("python"))]
    else:
        args = node_program.program_args(
            request.language, rt.interpreter_args, limits, request.mode
        )
        argv = [*boot, "exec", rt.sandbox_interpreter, *args, str(code_path(request.language))]
    doc: dict[str, object] = {
        "env": {**common_env(), **rt.sandbox_env, **request.env, **sockets_env(sockets)},
        "rlimits": [
            [r.name, r.value]
            for r in bundle_plan.plan_rlimits(
                limits, request.mode, reserve=node_program.address_reserve(request.language)
            )
        ],
        "argv": argv,
    }
    bridge = bridge_argv(sockets, request.runtime)
    if bridge is not None:
        doc["bridge"] = bridge
    return json.dumps(doc).encode() + b"\n"


def sockets_env(sockets: SandboxSockets | None) -> dict[str, str]:
    """The program's environment additions for its ways out (none without)."""
    return sockets.env() if sockets is not None else {}


def bridge_argv(sockets: SandboxSockets | None, runtime: str | None = None) -> list[str] | None:
    """The egress bridge's command line inside a sandbox of ``runtime`` (None without egress)."""
    if sockets is None:
        return None
    return sockets.bridge_argv(python_runtime(runtime).sandbox_python)


def ingress_argv(sockets: SandboxSockets | None, runtime: str | None = None) -> list[str] | None:
    """A session's ingress agent's command line inside a sandbox of ``runtime`` (None without
    ingress ports): the agent starts it after the bridge, before the program."""
    if sockets is None:
        return None
    return sockets.ingress_argv(python_runtime(runtime).sandbox_python)


class GSandbox:
    """One sandbox, from its run directory to its removal (see the module). Not thread-safe,
    except :meth:`kill`, which may be called from any thread."""

    def __init__(self, host: Host, *, name: str, fixed: Fixed) -> None:
        self.host = host
        self.fixed = fixed
        self.name = name
        self.container_id = f"{workspace.owner_tag()}.{name}"
        self.run_dir = host.root / workspace.owner_tag() / f"gv-{name}"
        self.work = self.run_dir / "work"
        self.control = self.run_dir / "control"
        self.rootfs = self.run_dir / "rootfs"
        self.ways = self.run_dir / "ways"
        """0700 on the host: nobody but the supervisor's user reaches the sockets through it."""
        self.ways_view = self.ways / "view"
        """Bound read-only at ``/run/sandcell`` (a pooled sandbox's: at its parent, see
        ``plan.py``): links to the run's sockets and client files."""
        self.cgroup: cgroups.RunCgroup | None = None
        self.mounted = False
        self.helper: HelperChannel | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_status: int | None = None
        self.helper_cpu_ms = 0.0
        self.helper_maxrss = 0
        self._lock = threading.Lock()
        self._reaped = False
        self._sources = neutral_sources.NeutralSources()
        """The runtime's bytecode overlays; unmounted by :meth:`destroy` with the directory."""

    # -- 1. bundle, workspace, cgroup ------------------------------------------------------

    def create(
        self,
        preload: tuple[str, ...] = (),
        *,
        channel: bool = False,
        control: Mapping[str, bytes] | None = None,
    ) -> None:
        """Lay out the bundle (the agent to import ``preload``) and create the cgroup. Raises
        IsolationUnavailable when the workspace quota or the cgroup cannot be set up.
        ``channel``: the agent's stdin is a session's channel (see ``_agent.py``); ``control``:
        more read-only control files (a session's kernel)."""
        f = self.fixed
        self.work.mkdir(parents=True, mode=0o700)
        self.control.mkdir(mode=0o755)
        self.run_dir.chmod(0o755)
        if f.sockets:
            if not self.host.runsc.host_uds:
                raise IsolationUnavailable(
                    "run sockets",
                    f"runsc {self.host.runsc.release} has no --host-uds flag: the sandbox "
                    "cannot connect to the run's egress proxy or tool gateway",
                    "install a newer gVisor (runsc with --host-uds), or use a profile without "
                    "a network allowlist or tools",
                )
            self.ways.mkdir(mode=0o700)
            self.ways_view.mkdir()
            # Inside the sentry the sandbox's uid must read it (the host's umask may not allow).
            self.ways_view.chmod(0o755)
        if not self.host.runsc.rootless:
            try:
                workspace.mount_tmpfs(
                    self.work, size_bytes=f.workspace_bytes, inodes=f.workspace_inodes
                )
                self.mounted = True
                os.chown(self.work, SANDBOX_UID, SANDBOX_UID)
            except OSError as exc:
                raise IsolationUnavailable(
                    "workspace quota",
                    f"could not mount the workspace tmpfs: {exc}",
                    "check that the runs directory (SANDCELL_RUNS) is on a local filesystem",
                ) from exc
        files = {
            CONTROL_AGENT: self.host.agent_code,
            CONTROL_BOOT: self.host.boot_code,
            CONTROL_DISPLAY: self.host.display_code,
            CONTROL_SECCOMP: self.host.seccomp_program,
            **(control or {}),
        }
        for fname, data in files.items():
            self._write_control(fname, data)
        # The language's runtime: the Python runtime's mounts, and Node's for a Node program.
        py = runtime_for(f.language, f.runtime)
        agent = [py.sandbox_python, "-I", f"{CONTROL_DIR}/{CONTROL_AGENT}", ",".join(preload)]
        # A built runtime's bytecode already names the sandbox paths: no layer for it.
        moved, layers = neutral_sources.runtime_sources(
            py.mounts, self.host.root / "etc", py.prebuilt_bytecode
        )
        paths = [p for p in neutral_sources.gather(moved) if p[1] in layers]
        self._sources = neutral_sources.plan(paths, str(self.run_dir / "view"), layers=layers)
        if self.host.runsc.rootless:
            for d in self._sources.directories:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d, 0o755)
        else:
            neutral_sources.mount_all(self._sources)
        plan = bundle_plan.BundlePlan(
            rootfs=self.rootfs,
            mounts=[(self._sources.of(host), dest) for host, dest in py.mounts],
            files=support_files(self.host.root, py),
            workspace=self.work,
            control_dir=self.control,
            etc_dir=self.host.root / "etc",
            inputs=[(i.host_path, i.name) for i in f.inputs],
            packages=f.packages,
            env=f.env,
            command=[*agent, "--channel"] if channel else agent,
            rlimits=f.rlimits,
            tmp_bytes=f.tmp_bytes,
            uid=self.host.sandbox_uid,
            sockets_dir=self.ways_view if f.sockets else None,
            sockets_later=f.sockets_later,
        )
        self._make_rootfs(plan, py)
        host = self.host.cgroup_host
        if host is not None and f.memory_bytes is not None:
            self.cgroup = cgroups.RunCgroup(host, f"{workspace.owner_tag()}.gv-{self.name}")
            self.cgroup.create(self._cgroup_settings(f.memory_bytes, f.max_pids))

    def _cgroup_settings(
        self, memory_bytes: int, max_pids: int
    ) -> tuple[cgroups.CgroupSetting, ...]:
        assert self.host.cgroup_host is not None
        return cgroups.plan_settings(
            self.host.cgroup_host.version,
            memory_bytes=memory_bytes,
            max_pids=PIDS_PER_TASK * max_pids + PIDS_OVERHEAD,
            swap_accounting=cgroups.swap_accounting(self.host.cgroup_host),
        )

    def _make_rootfs(self, plan: bundle_plan.BundlePlan, py: Runtime) -> None:
        for point in bundle_plan.mount_points(plan):
            (self.rootfs / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for runtime_path, dest in plan.mounts:
            if os.path.isdir(runtime_path):
                (self.rootfs / dest.lstrip("/")).mkdir(parents=True, exist_ok=True)
            else:
                (self.rootfs / dest.lstrip("/")).touch()
        for _file, dest in plan.files:
            file_point = self.rootfs / dest.lstrip("/")
            # A file inside another runtime mount (a masked hook) is its own mount point.
            if file_point.parent.is_dir() and not file_point.exists():
                file_point.touch()
        for host_path, name in plan.inputs:
            input_point = self.rootfs / "inputs" / name
            if host_path.is_dir():
                input_point.mkdir(parents=True, exist_ok=True)
            else:
                input_point.touch()
        for pkg in plan.packages:
            (self.rootfs / PACKAGES_DIR.lstrip("/") / pkg.name).mkdir(parents=True, exist_ok=True)
        for name in bundle_plan.ETC_NAMES:
            (self.rootfs / "etc" / name).touch()
        for link, target in py.symlinks:
            os.symlink(target, self.rootfs / link.lstrip("/"))
        socket_link = bundle_plan.socket_link(plan)
        if socket_link is not None:
            os.symlink(socket_link[1], self.rootfs / socket_link[0].lstrip("/"))
        (self.run_dir / "config.json").write_text(json.dumps(bundle_plan.build_config(plan)))

    def attach_sockets(self, sockets: SandboxSockets) -> None:
        """Show the run's ways out in the socket view: hard links to its sockets and client
        files (a link, unlike a bind mount, also reaches a pooled sandbox that is already
        running, and an ordinary user can make it). As root the sockets are handed to the
        sandbox's uid, which connects to them inside the sentry; on the host they stay behind
        two 0700 directories of root's. Raises IsolationUnavailable when the links cannot be
        made (the runs directory on another filesystem than the sockets)."""
        if not self.fixed.sockets:
            raise InfraError("this sandbox was created without a socket view")
        present = [EGRESS_SOCKET] if sockets.egress else []
        present += [TOOLS_SOCKET] if sockets.tools else []
        present += [INGRESS_SOCKET] if sockets.ingress else []
        helpers = [BRIDGE_FILE, TOOLS_FILE, *([INGRESS_FILE] if sockets.ingress else [])]
        view = self.ways_view
        try:
            if self.fixed.sockets_later:
                for part in Path(bundle_plan.POOL_SOCKETS_NAME).parts:
                    view = view / part
                    view.mkdir()
                    view.chmod(0o755)
            (view / "lib").mkdir()
            (view / "lib").chmod(0o755)
            for name in (*helpers, *present):
                os.link(sockets.host_dir / name, view / name)
            if not self.host.runsc.rootless:
                for name in present:
                    os.chown(view / name, SANDBOX_UID, SANDBOX_GID)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise IsolationUnavailable(
                    "run sockets",
                    f"the runs directory {self.host.root} is on another filesystem than the "
                    f"run's sockets ({sockets.host_dir}), so the sandbox cannot be shown them",
                    "point SANDCELL_RUNS at a directory on the same filesystem as /tmp",
                ) from exc
            raise InfraError(f"could not show the run's sockets to the sandbox: {exc}") from exc

    def _write_control(self, name: str, data: bytes) -> None:
        path = self.control / name
        path.write_bytes(data)
        path.chmod(0o444)

    # -- 2. runsc --------------------------------------------------------------------------

    def spawn(self, stdin: int | None = None, *, image: Path | None = None) -> None:
        """Start ``runsc run`` (see the module). Raises InfraError if it cannot be started.
        ``stdin``: a descriptor for the agent's stdin (a session's channel) instead of a pipe.
        ``image``: ``runsc restore`` from this checkpoint image instead (a saved session), in
        the same cgroup and bundle as a fresh start; the restored program's stdio are the new
        process's."""
        if image is None:
            cmd = ["run", "--bundle", str(self.run_dir)]
        else:
            cmd = ["restore", "--image-path", str(image), "--bundle", str(self.run_dir)]
        argv = self.host.runsc.argv(*cmd, self.container_id, host_uds=self.fixed.sockets)
        if SETPRIV is not None:
            # runsc dies with the thread that started it (its sandbox is --attached to it, and
            # dies with it in turn): a supervisor killed by SIGKILL leaves no sandbox running
            # without its limits until the next sweep.
            argv = [SETPRIV, "--pdeathsig", "KILL", *argv]
        if self.cgroup is not None:
            joins = " && ".join(
                f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}"
                for d in self.cgroup.dirs.values()
            )
            argv = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *argv]
        pass_fds: tuple[int, ...] = ()
        if self.host.runsc.rootless:
            # An ordinary user cannot mount the workspace tmpfs on the host: the helper mounts
            # it in a mount namespace of its own and runs runsc there.
            self.helper = HelperChannel()
            result_w, hold_r = self.helper.child_fds()
            pass_fds = (result_w, hold_r)
            # The helper runs on the host: sandcell's own interpreter, whatever the runtime.
            argv = [
                python_runtime().python, "-I", "-S", str(MOUNT_HELPER), str(self.work),
                str(self.fixed.workspace_bytes), str(self.fixed.workspace_inodes),
                str(result_w), str(hold_r), "",
                *neutral_sources.helper_args(self._sources), "--", *argv,
            ]  # fmt: skip
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is None else stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                close_fds=True,
                env={},
                start_new_session=True,
            )
        except OSError as exc:
            raise InfraError(f"could not start runsc ({argv[0]}): {exc}") from exc
        finally:
            if self.helper is not None:
                self.helper.close_child_ends()

    # -- 4. the request --------------------------------------------------------------------

    def deliver(self, request: RunRequest, sockets: SandboxSockets | None = None) -> None:
        """Write the program and its boot plan, size the cgroup and workspace for ``request``,
        and send the request (then the program's stdin) to the agent. ``sockets``: the run's
        ways out, already attached (the agent starts the egress bridge before the program)."""
        limits = request.effective_limits
        if runtime_name(request.runtime) != runtime_name(self.fixed.runtime):
            raise InfraError(
                f"the sandbox mounts runtime {runtime_name(self.fixed.runtime)}, the request "
                f"is in runtime {runtime_name(request.runtime)}"
            )
        if (request.language in NODE_LANGUAGES) != (self.fixed.language in NODE_LANGUAGES):
            raise InfraError(
                f"the sandbox mounts the runtime of {self.fixed.language} programs, the request "
                f"is a {request.language} program"
            )
        self._write_control(code_path(request.language).name, request.code.encode("utf-8"))
        plan_text = landlock.boot_plan_json(
            plan=None,
            input_links=[(i.name, f"/inputs/{i.name}") for i in request.inputs],
            python_paths=[f"{PACKAGES_DIR}/{p.name}" for p in request.packages]
            + ([SANDBOX_LIB] if sockets is not None else []),
            display=(DISPLAY_DIR, f"{CONTROL_DIR}/{CONTROL_DISPLAY}")
            if displays(request)
            else None,
        )
        self._write_control(CONTROL_PLAN, plan_text.encode())
        if self.cgroup is not None and (
            limits.memory_bytes != self.fixed.memory_bytes or limits.max_pids != self.fixed.max_pids
        ):
            self._resize_cgroup(limits)
        if self.mounted and (
            limits.workspace_bytes != self.fixed.workspace_bytes
            or limits.workspace_inodes != self.fixed.workspace_inodes
        ):
            _remount_tmpfs(
                self.work, size_bytes=limits.workspace_bytes, inodes=limits.workspace_inodes
            )
        assert self.proc is not None and self.proc.stdin is not None
        data = request_line(request, self.host, sockets) + request.stdin
        stdin = self.proc.stdin
        threading.Thread(target=_feed, args=(stdin, data), daemon=True).start()

    def _resize_cgroup(self, limits: Limits) -> None:
        assert self.cgroup is not None
        settings = self._cgroup_settings(limits.memory_bytes, limits.max_pids)
        # memsw must stay at least memory: lower memory first, raise memsw first.
        if limits.memory_bytes > (self.fixed.memory_bytes or 0):
            settings = tuple(reversed(settings))
        for s in settings:
            path = self.cgroup.dirs[s.controller] / s.file
            if s.optional and not path.exists():
                continue
            path.write_text(s.value)

    # -- 5. the end ------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL every process of the sandbox (any thread; the supervisor stays to reap)."""
        with self._lock:
            if self._reaped:
                return
            if self.cgroup is not None:
                self.cgroup.kill_all()
            if self.proc is not None:
                if self.helper is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.proc.pid, 9)
                proctree.kill_tree(self.proc.pid)

    def wait(self) -> None:
        """Reap runsc (or read the helper's report); sets :attr:`exit_status`."""
        if self.proc is None or self._reaped:
            return
        if self.helper is not None:
            try:
                status, cpu, rss = self.helper.read_result(time.monotonic() + 15)
            except InfraError:
                self.kill()
                status, cpu, rss = 9, 0.0, 0
            self.exit_status, self.helper_cpu_ms, self.helper_maxrss = status, cpu, rss
        else:
            status, rusage = reap(self.proc)
            self.exit_status = status
            if rusage is not None:
                self.helper_cpu_ms = (rusage.ru_utime + rusage.ru_stime) * 1000
                self.helper_maxrss = rusage.ru_maxrss * 1024
        with self._lock:
            self._reaped = self.helper is None

    def forget_process(self) -> None:
        """After runsc exited with the sandbox kept (a checkpoint), drop the old process and
        its state so :meth:`spawn` can start the same bundle again, in the same cgroup and
        workspace. Only as root: an ordinary user's workspace went with its helper."""
        if self.helper is not None:
            raise InfraError("a rootless gVisor sandbox cannot be started again in place")
        if self.proc is not None:
            if self.exit_status is None:
                self.kill()
                self.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        if self.cgroup is not None:
            # The gofer may outlive runsc by a moment: nothing of the old sandbox may stay,
            # and its state files go so that the container id can be started again.
            self.cgroup.kill_all()
            runsc.forget(self.host.runsc, self.container_id)
        else:
            runsc.delete(self.host.runsc, self.container_id)
        with self._lock:
            self.proc, self.exit_status, self._reaped = None, None, False

    def workspace_view(self) -> Path:
        """The workspace as the host reads it (through the helper's mount namespace if any)."""
        if self.helper is not None and self.proc is not None:
            return Path(f"/proc/{self.proc.pid}/root{self.work}")
        return self.work

    def destroy(self) -> None:
        """Remove everything (see the module); may be called at any step, more than once."""
        if self.proc is not None:
            if self.exit_status is None:
                self.kill()
                self.wait()
            if self.helper is not None:
                self.helper.release()
                reap(self.proc)
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            with self._lock:
                self._reaped = True
        gone = self.proc is not None
        if self.cgroup is not None:
            gone = self.cgroup.remove() and gone
        elif self.helper is None and runsc.leftover(self.host.runsc, self.container_id):
            # Neither a cgroup nor the helper's reaping proves the sandbox gone: its processes
            # name the container in their command lines.
            gone = gone and not proctree.kill_matching([f" {self.container_id}"])
        if gone:
            runsc.forget(self.host.runsc, self.container_id)
        else:
            runsc.delete(self.host.runsc, self.container_id)
        if self.mounted:
            with contextlib.suppress(OSError):
                workspace.unmount(self.work)
            self.mounted = False
        workspace.remove_tree(self.run_dir)


def _remount_tmpfs(target: Path, *, size_bytes: int, inodes: int) -> None:
    """Resize the (empty) workspace tmpfs of a pooled sandbox to the request's quota."""
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"size={size_bytes},nr_inodes={inodes}".encode()
    flags = _MS_REMOUNT | _MS_NOSUID | _MS_NODEV
    if libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", flags, opts) != 0:
        err = ctypes.get_errno()
        raise InfraError(f"could not resize the workspace tmpfs {target}: {os.strerror(err)}")


def _feed(stream: object, data: bytes) -> None:
    """Write ``data`` to the agent's stdin, then close it (end-of-file ends the program's stdin)."""
    with contextlib.suppress(OSError, ValueError):
        stream.write(data)  # type: ignore[attr-defined]
    with contextlib.suppress(OSError, ValueError):
        stream.close()  # type: ignore[attr-defined]


__all__ = ["Fixed", "GSandbox", "Host", "fixed_for", "fixed_for_pool", "request_line"]
