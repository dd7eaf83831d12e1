"""The warm-start template, host side: start it, ask it for isolated children, watch it.

The template is one long-lived process (``_zygote.py``) in a bubblewrap sandbox built like a cold
run's: every namespace, the runtime read-only, synthetic ``/etc``, no network, no capabilities.
Two things differ, both so that each child can make its own sandbox: the seccomp filter is the
looser setup variant (:func:`seccomp.build_setup_policy`: unshare and mount stay allowed, the
run's full filter goes on in the child), and nested user namespaces are not disabled. ``/dev`` is
a read-only tmpfs with the usual device nodes (no ``/dev/pts``), since bwrap's ``--dev`` covers
parts of ``/proc`` in a way that would keep the children from mounting their own. ``/run`` is a
symlink into each child's own ``/sandcell`` tmpfs, where a run that reaches outside gets its
socket directory (``outside.py``); it leads nowhere in a run without one.

:meth:`Template.fork` returns a :class:`WarmChild`: a socket to a child that has isolated itself
(its namespaces, ``/proc``, tmpfs mounts) and waits for its request, and the host pid of its
pid 1, which the kernel translated through SCM_CREDENTIALS. The template never sees a request.

Security limitations: see ``_zygote.py``. The template shares the supervisor's cgroup, and a
template that dies takes every run forked from it with it (they end as ``infra_error``).
"""

from __future__ import annotations

import array
import contextlib
import importlib.util
import json
import marshal
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandcell.backends.host import cgroups, neutral_sources, workspace
from sandcell.backends.host.layout import SANDBOX_GID, SANDBOX_HOSTNAME, SANDBOX_UID
from sandcell.backends.host.runtime_mounts import bind_args
from sandcell.errors import InfraError
from sandcell.runtimes import Runtime

__all__ = [
    "Armed",
    "Template",
    "WarmChild",
    "compile_script",
    "compile_zygote",
    "recv_message",
    "send_message",
]

ZYGOTE_SCRIPT = Path(__file__).with_name("_zygote.py")
_MOUNT_HELPER = workspace.MOUNT_HELPER
ZYGOTE_PARTS = ("base", "program", "init")
"""The zygote's other parts (``_zygote_<part>.py``), loaded by ``_zygote.py`` in this order."""
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
RUN_LINK_TARGET = "/sandcell/run"
"""Where the template's ``/run`` symlink points: a directory a warm run with sockets makes in
its ``/sandcell`` tmpfs (``_zygote_init._apply_request``)."""
# Every BLAS and OpenMP pool single-threaded, and no allocator thread: the template must have
# exactly one thread when it forks, and a pool started lazily in a run would be that run's own.
# pyarrow (which pandas imports when it is installed) starts its bundled jemalloc's background
# thread on import unless told not to.
THREAD_ENV: Mapping[str, str] = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
PRELOAD_ONLY = "SANDCELL_PRELOAD_ONLY"
"""Names the variables of the template's environment that are for its preload only (and PWD):
the template removes them once its imports ran, so that its environment is the runs' usual one
and a pooled program's process has none to change (``_zygote_program._set_env``)."""


def compile_script(script: Path, sandbox_path: str) -> bytes:
    """A standalone script compiled to ``.pyc`` bytes for sandcell's own interpreter."""
    source = script.read_bytes()
    code = compile(source, sandbox_path, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") * 2
    return header + (len(source) & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code)


def compile_zygote() -> dict[str, bytes]:
    """The zygote's files for the template's ``/sandcell``: ``zygote.pyc`` and its parts."""
    files = {"zygote.pyc": compile_script(ZYGOTE_SCRIPT, "/sandcell/zygote.py")}
    for part in ZYGOTE_PARTS:
        files[f"zygote_{part}.pyc"] = compile_script(
            ZYGOTE_SCRIPT.with_name(f"_zygote_{part}.py"), f"/sandcell/zygote_{part}.py"
        )
    return files


# -- messages (the zygote's framing: 4-byte length, body; descriptors on the first byte) -----


def send_message(sock: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    anc = []
    if fds:
        anc.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes()))
    payload = struct.pack("=I", len(data)) + data
    sent = sock.sendmsg([payload], anc)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def recv_message(sock: socket.socket, deadline: float) -> tuple[bytes, int | None]:
    """One message and the sender's pid (host pid namespace) if credentials came with it."""
    creds_space = socket.CMSG_SPACE(struct.calcsize("=iII"))
    buf = b""
    pid: int | None = None
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("=I", buf[:4])[0]:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
            raise InfraError("the warm-start template did not answer in time")
        data, anc, _, _ = sock.recvmsg(65536, creds_space)
        if not data:
            raise InfraError("the warm-start template or its child closed the connection")
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and pid is None:
                pid = struct.unpack("=iII", payload[:12])[0]
        buf += data
    size = struct.unpack("=I", buf[:4])[0]
    if len(buf) != 4 + size:
        raise InfraError("the warm-start template sent more than one message at once")
    return buf[4:], pid


@dataclass(frozen=True, slots=True, kw_only=True)
class Armed:
    """What a pooled child was prepared with before any request: its cgroup (the child's pid 1
    is in it) and a program process already restricted under this Landlock ABI."""

    cgroup: cgroups.RunCgroup | None
    landlock_abi: int | None
    memory_bytes: int
    max_pids: int
    cpu_base_ms: float
    """CPU time the preparation itself left in the cgroup: not the run's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmChild:
    """One isolated, never-used child of the template, waiting for its request."""

    sock: socket.socket
    init_pid: int
    """Host pid of the run's pid-1 supervisor: the process to put in the cgroup."""
    pidfd: int
    """A pidfd of pid 1, opened while it waits for its request: every signal goes through it."""
    created: float = field(default_factory=time.monotonic)
    armed: Armed | None = None
    """Set when the child was prepared ahead (pool mode): cgroup joined, program restricted."""

    def alive(self) -> bool:
        """Still waiting: nothing to read (an end-of-file means it died)."""
        try:
            return not select.select([self.sock], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def send(self, sig: int) -> None:
        """Signal pid 1 through its pidfd, so never a process that took over its number."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, sig)

    def kill(self, cgroup: cgroups.RunCgroup | None = None) -> None:
        """Start its end and return at once: end-of-file on its socket, SIGKILL to pid 1, and
        SIGKILL to every process of ``cgroup`` (the group it ran in, if not the one it was
        prepared with), which thaws a frozen run so that it dies."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self.send(signal.SIGKILL)
        for group in (self.armed.cgroup if self.armed is not None else None, cgroup):
            if group is not None:
                group.kill_all()

    def release(self, cgroup: cgroups.RunCgroup | None = None, timeout_s: float = 5.0) -> None:
        """After :meth:`kill`: wait for pid 1 to exit, then remove the cgroups. Pid 1 exits
        only once the kernel has killed and reaped every other process of its pid namespace,
        so the groups are empty by then and each goes at the first rmdir (the removal polled
        the groups, killing again between tries, nine rmdirs and six reads of every
        ``cgroup.procs`` per sandbox: bench/PROFILE.md)."""
        with contextlib.suppress(OSError, ValueError):
            select.select([self.pidfd], [], [], timeout_s)
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        for group in (self.armed.cgroup if self.armed is not None else None, cgroup):
            if group is not None:
                group.remove()

    def discard(self) -> None:
        """Destroy it now (:meth:`kill`, then :meth:`release`)."""
        self.kill()
        self.release()


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateSpec:
    """What the template's sandbox is made of (pure data)."""

    bwrap: str
    runtime: Runtime
    control_dir: Path
    etc_dir: Path
    env: Mapping[str, str]
    preload: tuple[str, ...]
    seccomp_fd: int | None
    control_fd: int
    runtime_files: tuple[tuple[Path, str], ...] = ()
    """The runtime's synthetic files on the host (``runtime_mounts.support_files``)."""
    sources: neutral_sources.NeutralSources = field(default_factory=neutral_sources.NeutralSources)
    """Where each host path is bound from: overlays that keep host paths out of mountinfo."""


def build_template_argv(spec: TemplateSpec) -> list[str]:
    """The bwrap command line of the template (pure)."""
    a = [spec.bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    # The template is pid 1 of its pid namespace, not bwrap's reaper: its end kills every run
    # forked from it (their pid namespaces are nested in this one), without a process per run
    # waiting to pass a parent-death signal on (``_zygote_init._child``), and orphans are
    # reparented to it, where its ignored SIGCHLD reaps them.
    a += ["--as-pid-1"]
    a += ["--unshare-uts", "--unshare-cgroup"]
    a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", SANDBOX_HOSTNAME]
    a += ["--cap-drop", "ALL", "--new-session", "--clearenv"]
    for key in sorted(spec.env):
        a += ["--setenv", key, spec.env[key]]
    a += ["--perms", "1777", "--tmpfs", "/tmp", "--proc", "/proc", "--tmpfs", "/dev"]
    for dev in _DEVICES:
        if os.path.exists(f"/dev/{dev}"):
            a += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        a += ["--symlink", f"/proc/self/fd/{i}", f"/dev/{name}"]
    a += ["--symlink", "/proc/self/fd", "/dev/fd", "--dir", "/dev/shm", "--remount-ro", "/dev"]
    # Mount points of the children's own mounts.
    a += ["--dir", "/sandbox", "--dir", "/home/user", "--dir", "/inputs"]
    # A run's socket directory (run_sockets.SANDBOX_DIR, /run/sandcell) is moved into the run's
    # own /sandcell tmpfs: /run leads there, and leads nowhere (ENOENT) in a run without one,
    # as a cold run has no /run. The read-only root cannot get a /run per run.
    a += ["--symlink", RUN_LINK_TARGET, "/run"]
    src = spec.sources
    a += ["--ro-bind", src.of(spec.control_dir), "/sandcell"]
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        a += ["--ro-bind", f"{src.of(spec.etc_dir)}/{name}", f"/etc/{name}"]
    # The runtime at the same neutral paths as a cold run's, so the children see it there too.
    a += bind_args(spec.runtime, spec.runtime_files, src)
    a += ["--remount-ro", "/", "--chdir", "/"]
    if spec.seccomp_fd is not None:
        a += ["--seccomp", str(spec.seccomp_fd)]
    a += ["--", spec.runtime.sandbox_python, "-I", "/sandcell/zygote.pyc", str(spec.control_fd)]
    a.append(",".join(spec.preload))
    return a


class Template:
    """One running template process. Thread-safe: forks are serialised on the control socket."""

    def __init__(
        self,
        *,
        bwrap: str,
        runtime: Runtime,
        run_dir: Path,
        etc_dir: Path,
        runtime_files: tuple[tuple[Path, str], ...] = (),
        boot_code: bytes,
        zygote_files: Mapping[str, bytes],
        display_code: bytes,
        setup_seccomp: bytes,
        run_seccomp: bytes,
        preload: tuple[str, ...],
    ) -> None:
        self.preload = preload
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.id = f"{runtime.name}[{','.join(preload) or '-'}]@{int(self.started_at)}"
        control = run_dir / "control"
        control.mkdir(parents=True, mode=0o755)
        for name, data in (
            ("boot.pyc", boot_code),
            *zygote_files.items(),
            ("display.pyc", display_code),
            # The run's own filter, which each child installs on top of the setup one.
            ("seccomp.bpf", run_seccomp),
        ):
            (control / name).write_bytes(data)
            (control / name).chmod(0o444)
        self._sock, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        seccomp_fd = os.memfd_create("sandcell-template-seccomp", os.MFD_CLOEXEC)
        os.write(seccomp_fd, setup_seccomp)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        # bubblewrap adds PWD: not a run's either.
        only = ",".join((*THREAD_ENV, "PWD"))
        env = {**_base_env(runtime), **THREAD_ENV, PRELOAD_ONLY: only}
        sources = _plan_sources(runtime, run_dir, control, etc_dir, runtime_files)
        argv = build_template_argv(
            TemplateSpec(
                bwrap=bwrap,
                runtime=runtime,
                control_dir=control,
                etc_dir=etc_dir,
                runtime_files=runtime_files,
                sources=sources,
                env=env,
                preload=preload,
                seccomp_fd=seccomp_fd,
                control_fd=child_end.fileno(),
            )
        )
        self._view_mounts: list[str] = []
        if os.geteuid() == 0:
            self._view_mounts = neutral_sources.mount_all(sources)
        else:
            # An ordinary user mounts the overlays in a namespace of its own, which then
            # becomes bwrap (the workspace helper's exec mode).
            for d in sources.directories:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d, 0o755)
            helper = [runtime.python, "-I", "-S", str(_MOUNT_HELPER), "-", "0", "0", "-", "-"]
            argv = [*helper, "", *neutral_sources.helper_args(sources), "--", *argv]
        self.log_path = run_dir / "template.log"
        try:
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(child_end.fileno(), seccomp_fd),
                    close_fds=True,
                    env={},
                    start_new_session=True,
                )
        except OSError as exc:
            neutral_sources.unmount_all(self._view_mounts)
            raise InfraError(f"could not start the warm-start template: {exc}") from exc
        finally:
            child_end.close()
            os.close(seccomp_fd)
        self.pid: int | None = None
        self.state: dict[str, Any] = {}
        self.error: str | None = None

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the template's preload; raises InfraError with its log if it failed."""
        with self._lock:
            if self.pid is not None:
                return
            try:
                body, pid = recv_message(self._sock, time.monotonic() + timeout_s)
            except InfraError as exc:
                self.error = f"{exc}: {self._log_tail()}"
                raise InfraError(self.error) from exc
            doc = json.loads(body)
            if "ready" not in doc or pid is None:
                self.error = f"the template refused to start: {doc.get('error', doc)}"
                raise InfraError(self.error)
            self.pid, self.state = pid, doc["ready"]

    def alive(self) -> bool:
        return self.error is None and self._proc.poll() is None

    def fork(self, timeout_s: float = 30.0) -> WarmChild:
        """A new child, isolated and waiting for its request."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        try:
            with self._lock:
                if self.pid is None or not self.alive():
                    raise InfraError(f"the warm-start template is not running: {self.error}")
                try:
                    send_message(self._sock, b"F", [child_end.fileno()])
                except OSError as exc:
                    self.error = f"the template's control socket failed: {exc}"
                    raise InfraError(self.error) from exc
            child_end.close()
            deadline = time.monotonic() + timeout_s
            # The forked child's own hello; it exits once it has forked the run's pid 1.
            msg, outer = recv_message(parent_end, deadline)
            if msg != b"C" or outer is None:
                raise InfraError(f"the template's child did not identify itself: {msg[:200]!r}")
            msg, init = recv_message(parent_end, deadline)
            if msg != b"R" or init is None:
                raise InfraError(f"the template's child failed to isolate itself: {msg[:200]!r}")
            # Pid 1 is alive and blocked on its socket now, so this is its pid, not a reuse.
            pidfd = os.pidfd_open(init)
        except BaseException:
            child_end.close()
            parent_end.close()
            raise
        return WarmChild(sock=parent_end, init_pid=init, pidfd=pidfd)

    def query_state(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The template's state now: its pid, threads and a digest of its sys.modules."""
        with self._lock:
            send_message(self._sock, b"S")
            body, _ = recv_message(self._sock, time.monotonic() + timeout_s)
        state: dict[str, Any] = json.loads(body)
        return state

    def close(self) -> None:
        """End the template and every child of it (end-of-file, then SIGKILL to the group)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        neutral_sources.unmount_all(self._view_mounts)
        self._view_mounts = []

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return "no log"
        return text[-2000:] or "no output"


def _plan_sources(
    runtime: Runtime,
    run_dir: Path,
    control: Path,
    etc_dir: Path,
    runtime_files: Sequence[tuple[Path, str]],
) -> neutral_sources.NeutralSources:
    """The template's read-only host sources as overlays (like a cold run's): its control
    directory, the synthetic ``/etc``, and the runtime's paths that move."""
    moved, layers = neutral_sources.runtime_sources(
        runtime.mounts, etc_dir, runtime.prebuilt_bytecode
    )
    paths: list[str | Path] = [control, etc_dir, *moved, *(host for host, _ in runtime_files)]
    return neutral_sources.plan(neutral_sources.gather(paths), str(run_dir / "view"), layers=layers)


def _base_env(runtime: Runtime) -> dict[str, str]:
    from sandcell.runtimes import common_env

    return {**common_env(), **runtime.sandbox_env}
