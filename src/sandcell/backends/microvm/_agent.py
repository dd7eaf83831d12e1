"""sandcell's guest agent: pid 1 of the microVM (standalone, stdlib only, no sandcell imports).

Boot: mount /tmp, /run and the cgroup2 hierarchy, find the virtio-serial port named
``sandcell``, start the runner (``runner.py``: the runtime's interpreter, which imports the
preload modules named on the kernel command line ``sandcell.preload=``) and wait until it is
ready. Then answer the host's handshake (``SCHELLO``/``SCGO``/``SCREADY``; a VM restored from a
snapshot resumes here, waiting for its host). Per VM, exactly one job:

1. the job (JSON): fresh entropy (added with RNDADDENTROPY, then a forced reseed of the kernel's
   generator), the host's wall clock, a fresh hostname; the inputs (written to a tmpfs at
   /inputs, remounted read-only; the run's cache packages likewise at /packages), the
   size-capped workspace tmpfs at /sandbox, a private /tmp, the program at /sandcell
   (read-only), the program's cgroup (memory, pids);
2. the runner is handed the job and the program's pipes; it joins the cgroup, sets the rlimits,
   drops to uid 1000 and runs the program. Output is streamed to the host while the program
   runs (:class:`Batch`: capped here too, small writes sent together at most
   :data:`BATCH_DELAY_S` later); stdin is fed from the host. A ``K`` frame kills the program's
   cgroup;
3. the exit frame (status, OOM kills, CPU time, peak memory), then the files of /sandbox that
   match the export globs (and the display directory), walked without following any link, then
   ``Z``; the VM is then destroyed by the host.

A session (``Q`` instead of ``J``) sets up the same way, then the runner becomes the session's
kernel (the host's ``_kernel.py``, sent with the job, run by :data:`SESSION_BOOT`) with its
control channel, stdout and stderr held here: ``C`` frames carry the host's kernel messages in,
``M`` frames the kernel's out (each followed by an ``a`` frame with the cgroup's usage), output
goes out as ``O``/``E`` capped per cell, ``I`` interrupts the kernel (SIGINT), ``K`` kills the
cgroup, ``T`` lists the workspace's files (``N``) and ``U`` sends files (workspace globs, or a
cell's display directory) as a run's exports; ``X`` reports the kernel's end. The agent
acknowledges the session job with ``q`` at once, so that a host can tell an agent without
sessions (which ignores the job) from a slow guest.

A job with ``sockets`` (a run or a session whose profile has an allowlist or tools) gets
/run/sandcell before its inputs: the client and bridge sources in ``lib/``, ``egress.sock`` and
``tools.sock`` served by :class:`Forwarder` (each connection a program makes travels over the
port as ``R`` frames to the host's relay, ``relay.py``, under its credit flow control), the
loopback interface up, and, for egress, the bridge on 127.0.0.1:3128 in the program's cgroup as
its user; then an ``R`` ready frame.

Everything the program can touch is treated as hostile here too: the walk never follows a link,
and sizes are capped. The host re-checks everything.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import fnmatch
import json
import os
import select
import signal
import socket
import stat
import struct
import time

# Not imported at run time: pid 1 of a guest starts faster without typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Job = dict[str, Any]

MAX_FRAME = 1 << 20
HEADER = struct.Struct(">cI")
PORT_NAME = "sandcell"
UID = GID = 1000
CG = "/sys/fs/cgroup"
PROG_CG = CG + "/prog"
DISPLAY_DIRNAME = ".sandcell-display"
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC = 4096, 16384
MAX_EXPORT_FILES = 10000
BATCH_BYTES = 64 << 10
BATCH_DELAY_S = 0.03

_libc = ctypes.CDLL(None, use_errno=True)


def log(msg: str) -> None:
    try:
        with open("/dev/console", "w") as f:
            f.write(f"sandcell-agent: {msg}\n")
    except OSError:
        pass


def mount(src: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    if _libc.mount(src.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def write_file(path: str, text: str) -> None:
    # Plain descriptors, not Python's text files: under TCG each layer of those costs.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_file(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


# -- the port -----------------------------------------------------------------------------


def find_port() -> str:
    base = "/sys/class/virtio-ports"
    for _ in range(500):
        try:
            for dev in os.listdir(base):
                with open(f"{base}/{dev}/name") as f:
                    if f.read().strip() == PORT_NAME:
                        return f"/dev/{dev}"
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("no virtio-serial port named sandcell")


class Port:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.buf = bytearray()
        self.early: list[tuple[bytes, bytes]] = []

    def read_some(self, timeout: float) -> bool:
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            # No host connected yet (or it went away): a restored VM waits for its new host.
            time.sleep(0.005)
            return False
        self.buf += data
        return True

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                select.select([], [self.fd], [], 1.0)
                continue
            view = view[n:]

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        for i in range(0, max(len(payload), 1), MAX_FRAME):
            part = payload[i : i + MAX_FRAME]
            self.write(HEADER.pack(kind, len(part)) + part)

    def handshake(self) -> None:
        nonce = None
        while True:
            while b"\n" not in self.buf:
                self.read_some(1.0)
                if len(self.buf) > 1 << 16:
                    del self.buf[: -(1 << 12)]
            line, _, rest = bytes(self.buf).partition(b"\n")
            self.buf = bytearray(rest)
            words = line.split()
            if len(words) == 2 and words[0].endswith(b"SCHELLO"):
                nonce = words[1]
                self.write(b"SCHELLO " + nonce + b"\n")
            elif len(words) == 2 and words[0].endswith(b"SCGO") and words[1] == nonce:
                self.write(b"SCREADY " + nonce + b"\n")
                return

    def frames(self, timeout: float) -> list[tuple[bytes, bytes]]:
        """Complete frames available now (waiting up to ``timeout`` for more bytes). Every
        frame returned must be handled: none is kept for a later call."""
        out, self.early = self.early, []
        if not out:
            self.read_some(timeout)
        while len(self.buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self.buf)
            if length > MAX_FRAME:
                raise RuntimeError("oversized frame from the host")
            end = HEADER.size + length
            if len(self.buf) < end:
                break
            out.append((kind, bytes(self.buf[HEADER.size : end])))
            del self.buf[:end]
        return out


class Batch:
    """One output stream on its way to the host, as ``O``/``E`` frames while the program runs.

    At most ``cap`` bytes are sent in all (the host's cap plus one: the host sees it passed).
    Reads of a few bytes (an unbuffered ``print`` per line) are held until :data:`BATCH_BYTES`
    gathered or the oldest is :data:`BATCH_DELAY_S` old, so a chatty program sends a few frames a
    second, not one per write, on the port that also carries the run's socket traffic.
    """

    def __init__(self, port: Port, kind: bytes, cap: int) -> None:
        self.port = port
        self.kind = kind
        self.room = cap
        self.held = bytearray()
        self.since: float | None = None

    def reset(self, cap: int) -> None:
        """A new cell: what is held goes first, then ``cap`` bytes more may go."""
        self.flush()
        self.room = cap

    def add(self, data: bytes) -> None:
        part = data[: self.room]
        self.room -= len(part)
        if not part:
            return
        self.held += part
        if self.since is None:
            self.since = time.monotonic()
        if len(self.held) >= BATCH_BYTES or self.room == 0:
            self.flush()

    def wait(self, now: float) -> float | None:
        """Seconds until what is held must go (None: nothing held)."""
        return None if self.since is None else max(self.since + BATCH_DELAY_S - now, 0.0)

    def flush_due(self, now: float) -> None:
        if self.since is not None and now >= self.since + BATCH_DELAY_S:
            self.flush()

    def flush(self) -> None:
        if self.held:
            self.port.send(self.kind, bytes(self.held))
            self.held.clear()
        self.since = None


def select_timeout(batches: list[Batch], longest: float) -> float:
    """How long a select may wait without holding output past its time."""
    now = time.monotonic()
    waits = [w for w in (b.wait(now) for b in batches) if w is not None]
    return min([longest, *waits])


# -- boot ---------------------------------------------------------------------------------


def cmdline_preload() -> str:
    try:
        with open("/proc/cmdline") as f:
            words = f.read().split()
    except OSError:
        return ""
    for w in words:
        if w.startswith("sandcell.preload="):
            return w.partition("=")[2]
    return ""


def boot() -> tuple[int, socket.socket]:
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    # Allocations succeed and the program's cgroup limit decides (an OOM kill, reported as
    # memory_limit), as on the host, instead of a MemoryError from the guest's small RAM.
    write_file("/proc/sys/vm/overcommit_memory", "1")
    mount("cgroup2", CG, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    write_file(CG + "/cgroup.subtree_control", "+memory +pids +cpu")
    os.mkdir(PROG_CG)
    # The program sees only its own processes, not the guest's kernel threads or the agent
    # (set here, before the snapshot: no run pays for it).
    mount("proc", "/proc", "proc", MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.makedirs("/dev/shm", mode=0o755, exist_ok=True)
    # What the loopback bridge needs beyond the agent's own imports, loaded before a snapshot:
    # a run's bridge, forked from here, then starts without importing it.
    __import__("threading")
    # The runner starts in the program's cgroup, so that what it imports before the job (the
    # preload) is charged to the program, as the namespaces backend's template memory is not.
    sock_agent, sock_runner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "SANDCELL_PRELOAD": cmdline_preload(),
        "HOME": "/tmp",
    }
    # The runtime's interpreter at its neutral path (/opt/sandcell/venv/bin/python for a venv).
    with open("/opt/sandcell/interpreter") as f:
        python = f.read().strip()
    pid = os.fork()
    if pid == 0:
        try:
            sock_agent.close()
            write_file(PROG_CG + "/cgroup.procs", str(os.getpid()))
            os.dup2(sock_runner.fileno(), 3, inheritable=True)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve(python, [python, "-I", "/opt/sandcell/runner.py", "3"], env)
        finally:
            os._exit(127)
    sock_runner.close()
    ready = sock_agent.recv(64)
    if not ready.startswith(b"R"):
        raise RuntimeError(f"the runner failed to start: {ready[:200]!r}")
    return pid, sock_agent


# -- the job ------------------------------------------------------------------------------


def reseed(entropy: bytes, *, credit: bool = True) -> None:
    fd = os.open("/dev/urandom", os.O_WRONLY)
    try:
        bits = len(entropy) * 8 if credit else 0
        info = struct.pack("ii", bits, len(entropy)) + entropy
        fcntl.ioctl(fd, RNDADDENTROPY, info)
        fcntl.ioctl(fd, RNDRESEEDCRNG)
    finally:
        os.close(fd)


def set_identity(job: Job) -> None:
    time.clock_settime_ns(time.CLOCK_REALTIME, int(job["time_ns"]))
    socket.sethostname(job["hostname"])


def warm_kernel_paths(runner_pid: int) -> None:
    """The code a job takes here (mounts, cgroup files, clock, entropy, the program's pipes),
    run once and undone: a VM restored from a snapshot starts with nothing translated, and
    what is translated here before it waits in the pool is not translated during a run."""
    warm = {"inputs": [], "code": "pass\n", "code_path": "/sandcell/main.py"}
    lim = {"workspace_bytes": 1 << 20, "workspace_inodes": 64, "tmp_bytes": 1 << 20}
    start_workspace(warm, lim)
    for target in (b"/sandcell", b"/dev/shm", b"/tmp", b"/home/user", b"/sandbox"):
        _libc.umount2(target, 0)
    reseed(os.urandom(64), credit=False)
    set_identity({"time_ns": time.time_ns(), "hostname": socket.gethostname()})
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        write_file(f"{PROG_CG}/{name}", "max")
    cgroup_stats(cpu_usage_ms())
    fds = [*os.pipe(), os.pidfd_open(runner_pid)]
    select.select(fds, [], [], 0)
    reap()
    for fd in fds:
        os.close(fd)
    # A run with sockets compiles the bridge (see start_bridge) and brings the loopback up:
    # the compiler's and the network stack's code, translated now, is hundreds of milliseconds
    # less under TCG (the flags are only read here).
    compile(WARM_MODULE, "<warm>", "exec", dont_inherit=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0))


WARM_MODULE = """
from __future__ import annotations
import contextlib, os, socket, sys, threading
_CHUNK = 64 * 1024
class Bridge:
    \"\"\"Doc.\"\"\"
    def __init__(self, listen: tuple[str, int], target: str) -> None:
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._thread: threading.Thread | None = None
        self.port: int = self._listener.getsockname()[1]
    def serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()
def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return
def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0] or not argv[0].rpartition(":")[2].isdigit():
        print("usage", file=sys.stderr)
        return 2
    host, _, port = argv[0].rpartition(":")
    print(f"{port} {[p for p in argv if p]}", flush=True)
    return 0
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def tmpfs(target: str, size: int, inodes: int, mode: int, uid: int = 0) -> None:
    opts = f"size={size},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid}"
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def remount_ro(target: str) -> None:
    mount("none", target, "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def receive_inputs(port: Port, job: Job) -> bytes:
    lim = job["limits"]
    if job["inputs"]:
        tmpfs("/inputs", job["inputs_bytes"] + (1 << 20), 1 << 20, 0o755)
    if job.get("packages"):
        # Cache packages, verified by the host: root's, read-only before the program starts.
        tmpfs("/packages", job["packages_bytes"] + (1 << 20), 1 << 20, 0o755)
    current = None
    left = 0
    stdin = bytearray()
    while True:
        frames = port.frames(1.0)
        while frames:
            kind, payload = frames.pop(0)
            if kind == b"F":
                meta = json.loads(payload)
                area = "/packages/" if meta.get("area") == "packages" else "/inputs/"
                path = area + meta["path"]
                if meta["type"] == "dir":
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                current = os.open(path, flags, 0o444)
                left = meta["size"]
                if left == 0:
                    os.close(current)
                    current = None
            elif kind == b"D" and current is not None:
                os.write(current, payload)
                left -= len(payload)
                if left <= 0:
                    os.close(current)
                    current = None
            elif kind == b"S":
                stdin += payload
            elif kind == b"G":
                start_workspace(job, lim)
                port.early = frames
                return bytes(stdin)
            elif kind == b"K":
                raise SystemExit("killed before the program started")


def start_workspace(job: Job, lim: Job) -> None:
    if job["inputs"]:
        remount_ro("/inputs")
    if job.get("packages"):
        remount_ro("/packages")
    tmpfs("/sandbox", lim["workspace_bytes"], lim["workspace_inodes"], 0o755, UID)
    # The workspace again where code written for other sandboxes expects its home (E2B's).
    mount("/sandbox", "/home/user", "", MS_BIND)
    # The image's runtime is under /opt (nothing under /tmp): the run's /tmp hides nothing.
    tmpfs("/tmp", lim["tmp_bytes"], 16384, 0o1777)
    # POSIX shared memory (multiprocessing's locks and queues), capped like /tmp.
    tmpfs("/dev/shm", lim["tmp_bytes"], 16384, 0o1777)
    for name in job["inputs"]:
        os.symlink(f"/inputs/{name}", f"/sandbox/{name}")
        os.lchown(f"/sandbox/{name}", UID, GID)
    tmpfs("/sandcell", 4 * len(job["code"]) + (1 << 16), 16, 0o755)
    with open(job["code_path"], "w", encoding="utf-8") as f:
        f.write(job["code"])
    remount_ro("/sandcell")


def prepare_cgroup(lim: Job) -> None:
    write_file(PROG_CG + "/memory.max", str(lim["memory_bytes"]))
    write_file(PROG_CG + "/memory.swap.max", "0")
    write_file(PROG_CG + "/pids.max", str(lim["max_pids"]))


def kill_cgroup() -> None:
    with contextlib.suppress(OSError):
        write_file(PROG_CG + "/cgroup.kill", "1")


def cpu_usage_ms() -> float | None:
    try:
        for line in read_file(PROG_CG + "/cpu.stat").splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec":
                return int(v) / 1000
    except (OSError, ValueError):
        pass
    return None


def cgroup_stats(cpu_before: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"oom_kill": 0, "cpu_ms": None, "peak_bytes": None}
    try:
        for line in read_file(PROG_CG + "/memory.events").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                out["oom_kill"] = int(v)
        cpu = cpu_usage_ms()
        if cpu is not None:
            # The runner's start and preload ran in this cgroup before the job.
            out["cpu_ms"] = max(cpu - (cpu_before or 0), 0)
        out["peak_bytes"] = int(read_file(PROG_CG + "/memory.peak"))
    except (OSError, ValueError):
        pass
    return out


def run_program(  # noqa: PLR0917 - the agent keeps to plain functions (see module)
    port: Port,
    runner_pid: int,
    runner_sock: socket.socket,
    job: Job,
    stdin: bytes,
    fwd: Forwarder | None = None,
) -> int:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    brief = {k: v for k, v in job.items() if k != "code"}
    socket.send_fds(runner_sock, [json.dumps(brief).encode()], [in_r, out_w, err_w])
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    # Per stream, one byte over the cap tells the host the cap was passed.
    batches = {
        out_r: Batch(port, b"O", job["limits"]["stdout_bytes"] + 1),
        err_r: Batch(port, b"E", job["limits"]["stderr_bytes"] + 1),
    }
    open_fds = [out_r, err_r]
    os.set_blocking(in_w, False)
    pending_in = memoryview(stdin)
    if not pending_in:
        os.close(in_w)
        in_w = -1
    status: int | None = None
    # Woken when the runner exits, not by polling.
    exited = os.pidfd_open(runner_pid)
    while open_fds or status is None:
        wfds = [in_w] if in_w >= 0 else []
        rfds = [*open_fds, port.fd, *([exited] if status is None else [])]
        if fwd is not None and status is None:
            rfds += fwd.rfds()
            wfds += fwd.wfds()
        r, w, _ = select.select(rfds, wfds, [], select_timeout([*batches.values()], 1.0))
        if fwd is not None and status is None:
            fwd.ready(r, w)
        if in_w in w:
            try:
                n = os.write(in_w, pending_in[: 1 << 16])
                pending_in = pending_in[n:]
            except (BlockingIOError, BrokenPipeError):
                n = 0
            if not pending_in or (n == 0 and status is not None):
                os.close(in_w)
                in_w = -1
        for fd in r:
            if fd == exited:
                continue
            if fd == port.fd:
                for kind, payload in port.frames(0):
                    if kind == b"K":
                        kill_cgroup()
                    elif kind == b"R" and fwd is not None:
                        fwd.on_host(payload)
                continue
            if fd not in batches:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.remove(fd)
                os.close(fd)
                batches[fd].flush()
                continue
            batches[fd].add(data)
        now = time.monotonic()
        for batch in batches.values():
            batch.flush_due(now)
        # pid 1 reaps every orphan; the runner's own status is the program's.
        for pid, st in reap():
            if pid == runner_pid and status is None:
                status = st
                # Whatever the program left running dies with it; its pipes then close.
                kill_cgroup()
    for batch in batches.values():
        batch.flush()
    if in_w >= 0:
        os.close(in_w)
    os.close(exited)
    return status


def reap() -> list[tuple[int, int]]:
    """(pid, status) of every child that has exited, reaped."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, st))


# -- exports ------------------------------------------------------------------------------


def glob_match(parts: list[str], globs: list[str]) -> bool:
    return any(_match(parts, g.split("/")) for g in globs)


def _match(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _match(parts[1:], pats[1:])


def _may_descend(parts: list[str], globs: list[str]) -> bool:
    for g in globs:
        pats = g.split("/")
        if "**" in pats[: len(parts) + 1]:
            return True
        if len(pats) > len(parts) and all(
            fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pats, strict=False)
        ):
            return True
    return False


def send_exports(
    port: Port, globs: list[str], display: bool, budget: int, root_dir: str = "/sandbox"
) -> None:
    if display:
        globs = [*globs, DISPLAY_DIRNAME, DISPLAY_DIRNAME + "/*"]
    if not globs:
        return
    state = {"files": 0, "bytes": 0}

    def walk(dir_fd: int, parts: list[str]) -> None:
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        for name in names:
            if state["files"] >= MAX_EXPORT_FILES:
                return
            state["files"] += 1
            p = [*parts, name]
            rel = "/".join(p)
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError:
                continue
            matched = glob_match(p, globs)
            if stat.S_ISDIR(st.st_mode):
                if matched:
                    port.send(b"F", json.dumps({"path": rel, "type": "dir", "size": 0}).encode())
                if len(p) < 64 and (matched or _may_descend(p, globs)):
                    try:
                        fd = os.open(
                            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd
                        )
                    except OSError:
                        continue
                    try:
                        walk(fd, p)
                    finally:
                        os.close(fd)
                continue
            if not stat.S_ISREG(st.st_mode):
                # Named (or passed through) by a glob: the host re-creates a stand-in so that
                # its own export checks refuse it as they would on the host.
                if matched or _may_descend(p, globs):
                    mode = st.st_mode
                    kind = (
                        "symlink"
                        if stat.S_ISLNK(mode)
                        else "socket"
                        if stat.S_ISSOCK(mode)
                        else "special"
                    )
                    port.send(b"L", json.dumps({"path": rel, "kind": kind}).encode())
                continue
            if not matched:
                continue
            if state["bytes"] + st.st_size > budget:
                skip = {"path": rel, "kind": "oversized", "size": st.st_size}
                port.send(b"L", json.dumps(skip).encode())
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                data = b""
                size = os.fstat(fd).st_size
                while len(data) < size:
                    chunk = os.read(fd, min(MAX_FRAME, size - len(data)))
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
            state["bytes"] += len(data)
            header = {"path": rel, "type": "file", "size": len(data), "nlink": st.st_nlink}
            port.send(b"F", json.dumps(header).encode())
            for i in range(0, len(data), MAX_FRAME):
                port.send(b"D", data[i : i + MAX_FRAME])

    try:
        root = open_dir_nofollow(root_dir)
    except OSError:
        return
    try:
        walk(root, [])
    finally:
        os.close(root)


# -- the run's sockets ----------------------------------------------------------------------

SOCKETS_DIR = "/run/sandcell"
GUEST_PYTHON = "/usr/bin/python3"
RELAY_ID = struct.Struct(">I")
RELAY_WINDOW = 256 << 10
RELAY_CHUNK = 64 << 10
RELAY_GRANT_AT = RELAY_WINDOW // 4
RELAY_MAX_CONNECTIONS = 128
BRIDGE_TIMEOUT_S = 60.0
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1


class Conn:
    __slots__ = ("eof_sent", "host_shut", "may_send", "out", "shut_done", "sock", "to_grant")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.may_send = RELAY_WINDOW
        self.to_grant = 0
        self.eof_sent = False
        self.host_shut = False
        self.shut_done = False


class Forwarder:
    """The guest half of the run's sockets (the host's is ``relay.py``): listens on
    /run/sandcell/egress.sock and tools.sock, and carries each connection a program makes over
    the port as ``R`` frames, with the host's credit-based flow control. A loopback bridge
    (the host's ``sandcell_bridge.py``) serves 127.0.0.1:PORT for HTTP clients."""

    def __init__(self, port: Port) -> None:
        self.port = port
        self.listeners: dict[int, tuple[socket.socket, bytes]] = {}
        self.conns: dict[int, Conn] = {}
        self.fds: dict[int, int] = {}
        self.next_id = 1

    def setup(self, spec: Job, lim: Job) -> None:
        os.makedirs(SOCKETS_DIR, mode=0o755, exist_ok=True)
        lib = SOCKETS_DIR + "/lib"
        os.mkdir(lib, 0o755)
        for name, text in spec["lib"].items():
            if "/" in name or not name.endswith(".py"):
                raise ValueError(f"bad library file name {name!r}")
            fd = os.open(f"{lib}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        os.chmod(lib, 0o555)  # noqa: S103 - the program reads the library, root owns it
        served = (("egress.sock", b"e", spec["egress"]), ("tools.sock", b"t", spec["tools"]))
        for name, target, wanted in served:
            if not wanted:
                continue
            path = f"{SOCKETS_DIR}/{name}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.bind(path)
            # Connecting needs write permission on the socket: the program's uid is not root's.
            os.chmod(path, 0o666)  # noqa: S103
            sock.listen(128)
            sock.setblocking(False)
            self.listeners[sock.fileno()] = (sock, target)
        report: dict[str, Any] = {}
        # Up in every run with sockets, as the namespaces backend's loopback is: a program
        # then meets a refused connection on 127.0.0.1 instead of an unreachable network.
        loopback_up()
        if spec["egress"]:
            report["bridge_port"] = start_bridge(spec, lim)
        self.port.send(b"R", b"r" + RELAY_ID.pack(0) + json.dumps(report).encode())

    def rfds(self) -> list[int]:
        fds = list(self.listeners)
        for c in self.conns.values():
            if c.may_send > 0 and not c.eof_sent:
                fds.append(c.sock.fileno())
        return fds

    def wfds(self) -> list[int]:
        return [c.sock.fileno() for c in self.conns.values() if c.out]

    def send(self, op: bytes, cid: int, data: bytes = b"") -> None:
        self.port.send(b"R", op + RELAY_ID.pack(cid) + data)

    def ready(self, r: list[int], w: list[int]) -> None:
        for fd in r:
            if fd in self.listeners:
                self.accept(*self.listeners[fd])
        for fd in w:
            cid = self.fds.get(fd)
            if cid is not None:
                self.write(cid)
        for fd in r:
            cid = self.fds.get(fd)
            if cid is not None:
                self.read(cid)

    def accept(self, listener: socket.socket, target: bytes) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        if len(self.conns) >= RELAY_MAX_CONNECTIONS:
            sock.close()
            return
        sock.setblocking(False)
        cid = self.next_id
        self.next_id += 1
        self.conns[cid] = Conn(sock)
        self.fds[sock.fileno()] = cid
        self.send(b"o", cid, target)

    def read(self, cid: int) -> None:
        c = self.conns.get(cid)
        if c is None or c.eof_sent or c.may_send <= 0:
            return
        try:
            data = c.sock.recv(min(c.may_send, RELAY_CHUNK))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort(cid)
            return
        if data:
            c.may_send -= len(data)
            self.send(b"d", cid, data)
            return
        c.eof_sent = True
        self.send(b"h", cid)
        self.maybe_done(cid, c)

    def write(self, cid: int) -> None:
        c = self.conns.get(cid)
        if c is None:
            return
        if c.out:
            try:
                n = c.sock.send(c.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.abort(cid)
                return
            del c.out[:n]
            c.to_grant += n
            if c.to_grant >= RELAY_GRANT_AT:
                self.send(b"w", cid, RELAY_ID.pack(c.to_grant))
                c.to_grant = 0
        self.maybe_shut(cid, c)

    def maybe_shut(self, cid: int, c: Conn) -> None:
        if c.host_shut and not c.out and not c.shut_done:
            c.shut_done = True
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_WR)
        self.maybe_done(cid, c)

    def maybe_done(self, cid: int, c: Conn) -> None:
        if c.shut_done and c.eof_sent:
            self.drop(cid)

    def abort(self, cid: int) -> None:
        self.drop(cid)
        self.send(b"c", cid)

    def drop(self, cid: int) -> None:
        c = self.conns.pop(cid, None)
        if c is not None:
            self.fds.pop(c.sock.fileno(), None)
            c.sock.close()

    def on_host(self, payload: bytes) -> None:
        if len(payload) < 5:
            return
        op = payload[:1]
        (cid,) = RELAY_ID.unpack_from(payload, 1)
        c = self.conns.get(cid)
        if c is None:
            return
        data = payload[5:]
        if op == b"d":
            c.out += data
            self.write(cid)
        elif op == b"h":
            c.host_shut = True
            self.maybe_shut(cid, c)
        elif op == b"c":
            self.drop(cid)
        elif op == b"w" and len(data) == 4:
            c.may_send += RELAY_ID.unpack(data)[0]


def loopback_up() -> None:
    """The guest's loopback interface (its only one): the bridge listens on it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0))
        flags = struct.unpack_from("16sh", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))
    finally:
        s.close()


def start_bridge(spec: Job, lim: Job) -> int:
    """Start the bridge as the program's user in the program's cgroup (its limits, and it dies
    with the program's processes); returns the port it printed once listening.

    The host's command is ``GUEST_PYTHON -I BRIDGE ARGS``: this interpreter, which runs it in a
    forked child instead of starting anew (seconds under TCG). The child holds none of the
    agent's descriptors, and having changed its credentials without an exec it is not
    dumpable: the program, of the same uid, cannot read its memory."""
    import resource

    argv = spec["bridge_argv"]
    script = argv[2]
    if argv[:2] != [GUEST_PYTHON, "-I"] or not script.startswith(SOCKETS_DIR + "/lib/"):
        raise ValueError(f"unexpected bridge command {argv!r}")
    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), script, "exec", dont_inherit=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 127
        try:
            os.close(r)
            write_file(PROG_CG + "/cgroup.procs", str(os.getpid()))
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(w, 1)
            os.dup2(w, 2)
            # The port, the runner's socket, the listeners: the agent's, not the bridge's.
            os.closerange(3, 1 << 16)
            os.chdir("/")
            os.setgroups([])
            os.setresgid(GID, GID, GID)
            os.setresuid(UID, UID, UID)
            for res, value in (
                (resource.RLIMIT_CPU, int(lim["cpu_time_s"])),
                (resource.RLIMIT_NOFILE, int(lim["max_open_files"])),
                (resource.RLIMIT_NPROC, int(lim["max_pids"])),
                (resource.RLIMIT_FSIZE, 0),
                (resource.RLIMIT_CORE, 0),
            ):
                resource.setrlimit(res, (value, value))
            import sys

            sys.argv = argv[2:]
            os.environ.clear()
            os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            ns = {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__}
            exec(code, ns)  # noqa: S102 - the host's bridge, as its command line would run it
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(status)
    os.close(w)
    out = b""
    deadline = time.monotonic() + BRIDGE_TIMEOUT_S
    try:
        while b"\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                raise RuntimeError("the loopback bridge did not start in time")
            chunk = os.read(r, 4096)
            if not chunk:
                break
            out += chunk[: 1 << 14]
    finally:
        os.close(r)
    line = out.partition(b"\n")[0].strip()
    if not line.isdigit():
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"the loopback bridge failed: {' | '.join(tail)[:400]}")
    return int(line)


# -- sessions -----------------------------------------------------------------------------

SESSION_DIR = "/run/sandcell"
OUTPUTS_ROOT = "/tmp/.sandcell-outputs"
MAX_LISTED_PATH = 4096
# The program the runner runs for a session: the host's kernel (``_kernel.py``), in the runner's
# process (the preloaded modules already imported), with the display module the agent compiled.
SESSION_BOOT = (
    "import sys\n"
    "sys.argv = ['/sandcell/kernel.py', '--display', '/run/sandcell/display.pyc']\n"
    "with open('/run/sandcell/kernel.py', encoding='utf-8') as f:\n"
    "    source = f.read()\n"
    "exec(compile(source, '/sandcell/kernel.py', 'exec', dont_inherit=True),\n"
    "     {'__name__': '__main__', '__builtins__': __builtins__})\n"
)


def open_dir_nofollow(path: str) -> int:
    """A descriptor of the directory ``path`` (absolute), no component followed if a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open("/", flags)
    try:
        for name in [p for p in path.split("/") if p]:
            nxt = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_session_files(job: Job) -> None:
    """The host's kernel source, and its display module compiled by this interpreter (the
    runtime's base interpreter: the runner loads the bytecode)."""
    os.makedirs(SESSION_DIR, mode=0o755, exist_ok=True)
    with open(SESSION_DIR + "/kernel.py", "w", encoding="utf-8") as f:
        f.write(job["kernel_source"])
    import marshal
    import sys

    source = job["display_source"]
    code = compile(source, "/sandcell/display.py", "exec", dont_inherit=True)
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    header = magic + bytes(8) + (len(source) & 0xFFFFFFFF).to_bytes(4, "little")
    with open(SESSION_DIR + "/display.pyc", "wb") as f:
        f.write(header + marshal.dumps(code))


def session_main(
    port: Port,
    runner_pid: int,
    runner_sock: socket.socket,
    job: Job,
    frames: list[tuple[bytes, bytes]],
) -> None:
    """Serve one session: the runner becomes the kernel; cells, output, interrupts and files
    are relayed until the host destroys the VM."""
    # At once: the host tells an agent that knows sessions from one that ignores the job.
    port.send(b"q")
    fwd = None
    port.early = frames
    job["code"] = SESSION_BOOT
    job["code_path"] = "/sandcell/boot.py"
    try:
        reseed(bytes.fromhex(job["entropy"]))
        set_identity(job)
        prepare_cgroup(job["limits"])
        write_session_files(job)
        if job.get("sockets"):
            fwd = Forwarder(port)
            fwd.setup(job["sockets"], job["limits"])
        receive_inputs(port, job)
    except Exception as exc:
        port.send(b"W", json.dumps({"message": f"guest session setup failed: {exc}"}).encode())
        raise
    ctl, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    skip = ("code", "kernel_source", "display_source")
    brief = {k: v for k, v in job.items() if k not in skip}
    brief.update(language="python", display=False)
    socket.send_fds(runner_sock, [json.dumps(brief).encode()], [kernel_end.fileno(), out_w, err_w])
    kernel_end.close()
    os.close(out_w)
    os.close(err_w)
    runner_sock.close()
    KernelRelay(port, runner_pid, ctl, out_r, err_r, lim=job["limits"], fwd=fwd).serve()


class KernelRelay:
    """Between the host and the session's kernel (see :func:`session_main`)."""

    def __init__(
        self,
        port: Port,
        pid: int,
        ctl: socket.socket,
        out_r: int,
        err_r: int,
        *,
        lim: Job,
        fwd: Forwarder | None = None,
    ) -> None:
        self.port = port
        self.fwd = fwd
        self.pid = pid
        self.ctl: socket.socket | None = ctl
        ctl.setblocking(False)
        self.outs = [out_r, err_r]
        # Non-blocking: a select's answer is stale once a drain (see from_kernel) read the pipe.
        for fd in self.outs:
            os.set_blocking(fd, False)
        # Per cell, as for a run: one byte over the cap tells the host the cap was passed.
        self.per_cell = {out_r: lim["stdout_bytes"] + 1, err_r: lim["stderr_bytes"] + 1}
        self.batches = {
            out_r: Batch(port, b"O", self.per_cell[out_r]),
            err_r: Batch(port, b"E", self.per_cell[err_r]),
        }
        self.to_kernel = bytearray()
        self.status: int | None = None

    def serve(self) -> None:
        exited = os.pidfd_open(self.pid)
        while True:
            rfds = [*self.outs, self.port.fd]
            if self.ctl is not None:
                rfds.append(self.ctl.fileno())
            if self.status is None:
                rfds.append(exited)
            wfds = [self.ctl.fileno()] if self.ctl is not None and self.to_kernel else []
            if self.fwd is not None and self.status is None:
                rfds += self.fwd.rfds()
                wfds += self.fwd.wfds()
            r, w, _ = select.select(rfds, wfds, [], select_timeout([*self.batches.values()], 1.0))
            if self.fwd is not None and self.status is None:
                self.fwd.ready(r, w)
            if self.ctl is not None and self.ctl.fileno() in w:
                self.flush_to_kernel()
            if self.ctl is not None and self.ctl.fileno() in r:
                self.from_kernel()
            for fd in list(self.outs):
                if fd in r:
                    self.relay_output(fd)
            now = time.monotonic()
            for batch in self.batches.values():
                batch.flush_due(now)
            if self.port.fd in r or self.port.early:
                for kind, payload in self.port.frames(0):
                    self.on_host(kind, payload)
            for pid, st in reap():
                if pid == self.pid and self.status is None:
                    self.kernel_ended(st)

    def flush_to_kernel(self) -> None:
        assert self.ctl is not None
        try:
            n = self.ctl.send(self.to_kernel[: 1 << 16])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.to_kernel.clear()
            return
        del self.to_kernel[:n]

    def from_kernel(self) -> None:
        assert self.ctl is not None
        try:
            data = self.ctl.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        # The kernel flushes a cell's output before it replies, so once the reply is read all
        # that output is in the pipes: relay it first. Drained after the read, not before: a
        # quick cell can print and reply between a drain and the read (its "started" message
        # woke this up). The drain is bounded: a process the cell left writing cannot hold the
        # reply back.
        for fd in list(self.outs):
            for _ in range(64):
                if fd not in self.outs or not select.select([fd], [], [], 0)[0]:
                    break
                self.relay_output(fd)
        # The host keeps a cell's output until its reply: what is held goes before it.
        for batch in self.batches.values():
            batch.flush()
        if not data:
            self.ctl.close()
            self.ctl = None
            return
        self.port.send(b"M", data)
        self.port.send(b"a", json.dumps(cgroup_stats(None)).encode())

    def relay_output(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self.outs.remove(fd)
            os.close(fd)
            self.batches[fd].flush()
            return
        self.batches[fd].add(data)

    def on_host(self, kind: bytes, payload: bytes) -> None:
        if kind == b"C":
            for fd, batch in self.batches.items():
                batch.reset(self.per_cell[fd])
            if self.ctl is not None:
                self.to_kernel += payload
                self.flush_to_kernel()
        elif kind == b"I":
            if self.status is None:
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGINT)
        elif kind == b"K":
            kill_cgroup()
        elif kind == b"R" and self.fwd is not None:
            self.fwd.on_host(payload)
        elif kind == b"T":
            list_workspace(self.port)
            self.port.send(b"Z")
        elif kind == b"U":
            send_session_files(self.port, payload)
            self.port.send(b"Z")

    def kernel_ended(self, status: int) -> None:
        self.status = status
        # Whatever the cells left running ends with the kernel, as the session does.
        kill_cgroup()
        for batch in self.batches.values():
            batch.flush()
        report = cgroup_stats(None)
        report["status"] = status
        self.port.send(b"X", json.dumps(report).encode())


def list_workspace(port: Port) -> None:
    """The regular files of /sandbox (relative paths), in batches, no link followed."""
    batch: list[str] = []
    size = 0
    count = 0

    def walk(dir_fd: int, prefix: str, depth: int) -> None:
        nonlocal size, count, batch
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        for name in names:
            if count >= MAX_EXPORT_FILES:
                return
            rel = prefix + name
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 64:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    walk(fd, rel + "/", depth + 1)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and len(rel) <= MAX_LISTED_PATH:
                count += 1
                batch.append(rel)
                size += len(rel) + 4
                if size > MAX_FRAME // 4:
                    port.send(b"N", json.dumps(batch).encode())
                    batch, size = [], 0

    try:
        root = open_dir_nofollow("/sandbox")
    except OSError:
        return
    try:
        walk(root, "", 0)
    finally:
        os.close(root)
    if batch:
        port.send(b"N", json.dumps(batch).encode())


def send_session_files(port: Port, payload: bytes) -> None:
    """Files the host asked for: workspace files matching globs, or one cell's display
    directory; any other place is refused (nothing sent)."""
    try:
        doc = json.loads(payload)
        root, globs, budget = doc["root"], doc["globs"], int(doc["budget"])
    except (ValueError, KeyError, TypeError):
        return
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        return
    if not isinstance(root, str):
        return
    cell = root[len(OUTPUTS_ROOT) + 1 :]
    if root != "/sandbox" and not (
        root.startswith(OUTPUTS_ROOT + "/") and cell.isdigit() and len(cell) < 16
    ):
        return
    send_exports(port, globs, False, budget, root_dir=root)


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = Port(find_port())
    try:
        runner_pid, runner_sock = boot()
    except Exception as exc:
        port.handshake()
        port.send(b"W", json.dumps({"message": f"guest boot failed: {exc}"}).encode())
        raise
    port.handshake()
    job = None
    while job is None:
        frames = port.frames(1.0)
        while frames:
            kind, payload = frames.pop(0)
            if kind == b"P":
                # Warm the translated code before the VM waits in the pool (see runner.warm).
                runner_sock.sendall(b'{"warm": true}')
                runner_sock.recv(1)
                warm_kernel_paths(runner_pid)
                port.send(b"p")
            elif kind == b"J":
                job = json.loads(payload)
                break
            elif kind == b"Q":
                session_main(port, runner_pid, runner_sock, json.loads(payload), frames)
    # Frames that came with the job (inputs, stdin, go) are handled next, in order.
    port.early = frames
    fwd = None
    try:
        reseed(bytes.fromhex(job["entropy"]))
        set_identity(job)
        prepare_cgroup(job["limits"])
        if job.get("sockets"):
            fwd = Forwarder(port)
            fwd.setup(job["sockets"], job["limits"])
        stdin = receive_inputs(port, job)
    except Exception as exc:
        port.send(b"W", json.dumps({"message": f"guest setup failed: {exc}"}).encode())
        raise
    cpu_before = cpu_usage_ms()
    status = run_program(port, runner_pid, runner_sock, job, stdin, fwd)
    report = cgroup_stats(cpu_before)
    report["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    report["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    port.send(b"X", json.dumps(report).encode())
    send_exports(port, job["exports"], job["display"], job["export_budget"])
    port.send(b"Z")
    # The host destroys the VM; until then, nothing more happens here.
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:
        log(f"failed: {type(exc).__name__}: {exc}")
        _libc.reboot(0x4321FEDC)  # RB_POWER_OFF: the host sees QEMU exit
