"""sandcell process manager: background processes, terminals and directory watches of a session,
inside its sandbox.

The host installs this source into the session's kernel on first use (a cell in a private scope
execs it into a module registered as ``sys.modules['_sandcell_procs']``) and then calls
:func:`main` with one JSON request per cell; it prints one line, :data:`MARK` and a JSON object.
The module lives as long as the kernel: a memory pause keeps it (its table and its processes come
back with the kernel), a files-mode resume starts a fresh kernel without it (the table is empty).

Every process it starts is a child of the kernel, so it is inside the sandbox's namespaces,
limits (pids, memory, CPU) and Landlock domain and ends with the session. One pump thread (one
more task against the pids limit, however many processes) reads every process's output into
bounded ring buffers addressed by absolute offsets, writes queued stdin, reaps exits and reads
inotify. A PTY process gets a new session with the terminal as its controlling tty; its output
is its ``stdout``. Watches use inotify through ``ctypes`` on libc; where that cannot be loaded
they fall back to a snapshot of the tree compared every half second (``"polling": true`` in
the watch's reply), which sees creations, writes (size or mtime), and removals, and reports a
rename as a removal and a creation.

This file is standalone on purpose: it runs inside the sandbox and must not import sandcell.
Nothing it reports is trusted by the host beyond shape and size.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARK = "@sandcell-procs-reply@ "
"""What starts the reply line, so output a cell's leftover thread wrote is not taken for it."""
RING_BYTES = 1024 * 1024
"""Output kept per stream of a process; a reader further behind is told what it missed."""
STDIN_QUEUE_BYTES = 1024 * 1024
WATCH_EVENTS = 10000
MAX_WATCH_DIRS = 4096
_POLL_S = 0.5
_OWN_DIRS = frozenset({".sandcell-display", ".sandcell-outputs"})
"""The kernel's per-cell output directories (in the workspace on some rungs), remade by every
cell: sandcell's, never a change of the program's, so a watch does not report them."""

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
_IN_ISDIR, _IN_ONLYDIR = 0x40000000, 0x1000000
_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
    | _IN_DELETE_SELF | _IN_ONLYDIR
)  # fmt: skip


END_TAIL = 32 * 1024
"""The most of each stream a process's end record keeps (its last bytes)."""


class Failed(Exception):
    """A request that cannot be done; its message goes back to the host."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Ring:
    """The last ``cap`` bytes of a stream, addressed by absolute offset from its start."""

    def __init__(self, cap: int = RING_BYTES) -> None:
        self.cap = cap
        self.data = bytearray()
        self.start = 0
        self.eof = False

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        over = len(self.data) - self.cap
        if over > 0:
            del self.data[:over]
            self.start += over

    def read(self, offset: int, limit: int) -> dict[str, Any]:
        offset = max(0, min(offset, self.end))
        skipped = max(0, self.start - offset)
        first = max(offset, self.start)
        chunk = bytes(self.data[first - self.start : first - self.start + limit])
        return {
            "offset": first,
            "skipped": skipped,
            "data": base64.b64encode(chunk).decode("ascii"),
            "next": first + len(chunk),
            "end": self.end,
            "eof": self.eof,
        }


class _Proc:
    def __init__(self, popen: subprocess.Popen[bytes], request: dict[str, Any]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.request = request
        self.started_at = time.time()
        self.out = _Ring()
        self.err = _Ring()
        self.reads: dict[int, _Ring] = {}
        """Each descriptor the pump reads, and the ring it fills."""
        self.stdin_fd: int | None = None
        self.stdin_queue = bytearray()
        self.close_stdin = False
        self.pty_fd: int | None = None
        self.returncode: int | None = None
        self.end_told = False
        """Whether its end went to the host in a reply's ``ends`` (once: the host records it)."""

    def info(self) -> dict[str, Any]:
        rc = self.returncode
        r = self.request
        return {
            "pid": self.pid,
            "argv": r["argv"],
            "command": r.get("command"),
            "env": r.get("env") or {},
            "cwd": r.get("cwd"),
            "tag": r.get("tag"),
            "run_id": r.get("run_id"),
            "pty": r.get("pty"),
            "stdin": bool(r.get("stdin")) or r.get("pty") is not None,
            "started_at": self.started_at,
            "exited": rc is not None,
            "exit_code": rc if rc is not None and rc >= 0 else None,
            "signal": -rc if rc is not None and rc < 0 else None,
        }


class _Watch:
    def __init__(self, watch_id: int, path: str, recursive: bool) -> None:
        self.id = watch_id
        self.path = path
        self.recursive = recursive
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=WATCH_EVENTS)
        self.dropped = 0
        self.dirs: dict[int, str] = {}
        """inotify watch descriptor to the directory it watches."""
        self.snapshot: dict[str, tuple[int, int, bool]] | None = None
        """The polling fallback's view of the tree: path to (size, mtime_ns, is_dir)."""

    def add(self, kind: str, path: str, is_dir: bool) -> None:
        name = os.path.relpath(path, self.path)
        if _OWN_DIRS.intersection(name.split("/")):
            return
        last = self.events[-1] if self.events else None
        # A program writing a file in many writes is one "write" until something else happens.
        if last is not None and kind == "write" and last["type"] == kind and last["name"] == name:
            return
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append({"type": kind, "name": name, "is_dir": is_dir, "at": time.time()})


class Manager:
    """The table of processes and watches, and the pump thread that serves them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: dict[int, _Proc] = {}
        self.watches: dict[int, _Watch] = {}
        self.next_watch = 1
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.inotify: int | None = None
        self.inotify_error: str | None = None
        self.libc: Any = None
        self.thread = threading.Thread(target=self._pump, name="sandcell-procs", daemon=True)
        self.thread.start()

    # -- requests --------------------------------------------------------------------------------

    def spawn(self, r: dict[str, Any]) -> dict[str, Any]:
        argv = [str(a) for a in r["argv"]]
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (r.get("env") or {}).items()})
        size = r.get("pty")
        master = slave = None
        if size is not None:
            try:
                master, slave = os.openpty()
            except OSError as exc:
                raise Failed("no_pty", f"this sandbox has no pseudo-terminals ({exc})") from exc
            _set_size(master, int(size[0]), int(size[1]))
            env.setdefault("TERM", "xterm-256color")
        # Pipes made here, so this module owns (and alone closes) the parent's ends.
        ends: list[int] = []
        pipes: dict[str, int | None] = {"in": None, "out": None, "err": None}
        try:
            if slave is not None:
                ends.append(slave)
                popen = subprocess.Popen(
                    argv, stdin=slave, stdout=slave, stderr=slave, cwd=r.get("cwd"), env=env,
                    start_new_session=True, preexec_fn=_take_terminal,  # noqa: PLW1509 - see there
                )  # fmt: skip
            else:
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                ends += [out_w, err_w]
                pipes["out"], pipes["err"] = out_r, err_r
                stdin: int = subprocess.DEVNULL
                if r.get("stdin"):
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    ends.append(in_r)
                    pipes["in"], stdin = in_w, in_r
                popen = subprocess.Popen(
                    argv, stdin=stdin, stdout=out_w, stderr=err_w, cwd=r.get("cwd"), env=env,
                    start_new_session=True,
                )  # fmt: skip
        except BlockingIOError as exc:
            _close(master, *pipes.values())
            raise Failed("limit", f"the session's process limit is reached ({exc})") from exc
        except OSError as exc:
            _close(master, *pipes.values())
            raise Failed("spawn", f"cannot start {argv[0]!r}: {exc}") from exc
        finally:
            _close(*ends)
        proc = _Proc(popen, r)
        if master is not None:
            os.set_blocking(master, False)
            proc.pty_fd = proc.stdin_fd = master
            proc.reads[master] = proc.out
            proc.err.eof = True
        else:
            for fd, ring in ((pipes["out"], proc.out), (pipes["err"], proc.err)):
                if fd is not None:
                    os.set_blocking(fd, False)
                    proc.reads[fd] = ring
            proc.stdin_fd = pipes["in"]
            if proc.stdin_fd is not None:
                os.set_blocking(proc.stdin_fd, False)
        with self.lock:
            self.procs[proc.pid] = proc
        self._wake()
        return proc.info()

    def list(self, r: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            return {"processes": [p.info() for p in self.procs.values()]}

    def read(self, r: dict[str, Any]) -> dict[str, Any]:
        limit = max(0, int(r.get("max", 65536)))
        with self.lock:
            proc = self._proc(r)
            out = proc.out.read(int(r.get("stdout_from", 0)), limit)
            err = proc.err.read(int(r.get("stderr_from", 0)), limit)
            return {**proc.info(), "stdout": out, "stderr": err}

    def write(self, r: dict[str, Any]) -> dict[str, Any]:
        data = base64.b64decode(r["data"])
        with self.lock:
            proc = self._proc(r)
            if proc.stdin_fd is None or proc.close_stdin:
                raise Failed("no_stdin", f"process {proc.pid} has no open stdin")
            if len(proc.stdin_queue) + len(data) > STDIN_QUEUE_BYTES:
                raise Failed("stdin_full", f"process {proc.pid} is not reading its stdin")
            proc.stdin_queue += data
        self._wake()
        return {"queued": len(data)}

    def close_stdin(self, r: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            proc = self._proc(r)
            if proc.pty_fd is not None:
                # A terminal has no end of input of its own: what ^D means to the program.
                proc.stdin_queue += b"\x04"
            else:
                proc.close_stdin = True
        self._wake()
        return {}

    def signal(self, r: dict[str, Any]) -> dict[str, Any]:
        sig = int(r["signal"])
        with self.lock:
            proc = self._proc(r)
            if proc.returncode is None:
                # The process's own group (its session): what it started goes too.
                try:
                    os.killpg(proc.pid, sig)
                except OSError:
                    try:  # noqa: SIM105 - it may be gone between the check and the kill
                        os.kill(proc.pid, sig)
                    except OSError:
                        pass
        self._wake()
        return {}

    def resize(self, r: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            proc = self._proc(r)
            if proc.pty_fd is None:
                raise Failed("no_pty", f"process {proc.pid} has no terminal")
            _set_size(proc.pty_fd, int(r["rows"]), int(r["cols"]))
            proc.request["pty"] = [int(r["rows"]), int(r["cols"])]
        return {}

    def watch(self, r: dict[str, Any]) -> dict[str, Any]:
        path = os.path.abspath(str(r["path"]))
        if not os.path.isdir(path):
            raise Failed("not_found", f"{path} is not a directory")
        with self.lock:
            w = _Watch(self.next_watch, path, bool(r.get("recursive")))
            self.next_watch += 1
            if self._inotify() is not None:
                self._add_tree(w, path)
            else:
                w.snapshot = _snapshot(path, w.recursive)
            self.watches[w.id] = w
        self._wake()
        return {"watch_id": w.id, "path": path, "polling": w.snapshot is not None,
                "why": self.inotify_error}  # fmt: skip

    def watch_events(self, r: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            w = self._watch(r)
            events, dropped = list(w.events), w.dropped
            w.events.clear()
            w.dropped = 0
        return {"events": events, "dropped": dropped}

    def unwatch(self, r: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            w = self._watch(r)
            del self.watches[w.id]
            for wd in w.dirs:
                self._drop_wd(wd)
        return {}

    # -- inside ------------------------------------------------------------------------------

    def _proc(self, r: dict[str, Any]) -> _Proc:
        proc = self.procs.get(int(r["pid"]))
        if proc is None:
            raise Failed("not_found", f"no process {r['pid']} was started in this session")
        return proc

    def _watch(self, r: dict[str, Any]) -> _Watch:
        w = self.watches.get(int(r["watch_id"]))
        if w is None:
            raise Failed("not_found", f"no watch {r['watch_id']} in this session")
        return w

    def _wake(self) -> None:
        try:  # noqa: SIM105 - a full wake pipe already wakes the pump
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def _inotify(self) -> int | None:
        if self.inotify is None and self.inotify_error is None:
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
                if fd < 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                self.libc, self.inotify = libc, fd
            except Exception as exc:
                self.inotify_error = f"inotify unavailable ({exc}); polling"
        return self.inotify

    def _add_tree(self, w: _Watch, top: str) -> None:
        todo = [top]
        while todo and len(w.dirs) < MAX_WATCH_DIRS:
            path = todo.pop()
            wd = self.libc.inotify_add_watch(self.inotify, os.fsencode(path), _MASK)
            if wd < 0:
                continue
            w.dirs[wd] = path
            if w.recursive:
                with contextlib.suppress(OSError):
                    todo += [
                        e.path
                        for e in os.scandir(path)
                        if e.is_dir(follow_symlinks=False) and e.name not in _OWN_DIRS
                    ]

    def _drop_wd(self, wd: int) -> None:
        # One directory watched twice shares its descriptor: removed once nobody watches it.
        if not any(wd in w.dirs for w in self.watches.values()) and self.inotify is not None:
            self.libc.inotify_rm_watch(self.inotify, wd)

    def _pump(self) -> None:
        while True:
            with self.lock:
                reads: dict[int, _Proc | None] = {self.wake_r: None}
                writes: dict[int, _Proc] = {}
                for proc in self.procs.values():
                    for fd in proc.reads:
                        reads[fd] = proc
                    if proc.stdin_fd is not None and (proc.stdin_queue or proc.close_stdin):
                        writes[proc.stdin_fd] = proc
                if self.inotify is not None and self.watches:
                    reads[self.inotify] = None
                live = any(p.returncode is None for p in self.procs.values())
                polling = any(w.snapshot is not None for w in self.watches.values())
            timeout = _POLL_S if live or polling else None
            try:
                readable, writable, _ = select.select(list(reads), list(writes), [], timeout)
            except (OSError, ValueError):
                readable, writable = [], []
                time.sleep(0.05)  # a descriptor closed under select: the next round rebuilds
            with self.lock:
                for fd in readable:
                    if fd == self.wake_r:
                        _drain(fd)
                    elif fd == self.inotify:
                        self._read_inotify()
                    elif (reader := reads.get(fd)) is not None:
                        self._read_output(reader, fd)
                for fd in writable:
                    self._write_stdin(writes[fd])
                self._reap()
                self._poll_watches()

    def _read_output(self, proc: _Proc, fd: int, drain: bool = False) -> None:
        ring = proc.reads.get(fd)
        if ring is None:
            return
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:  # EIO: a terminal whose last user closed it
                chunk = b""
            if not chunk:
                ring.eof = True
                del proc.reads[fd]
                if fd != proc.pty_fd:  # a terminal's one descriptor is its input too
                    os.close(fd)
                return
            ring.add(chunk)
            if not drain:
                return

    def _write_stdin(self, proc: _Proc) -> None:
        fd = proc.stdin_fd
        if fd is None:
            return
        try:
            if proc.stdin_queue:
                n = os.write(fd, proc.stdin_queue)
                del proc.stdin_queue[:n]
        except BlockingIOError:
            return
        except OSError:  # the reader is gone: what is queued cannot be read by anyone
            proc.stdin_queue.clear()
            proc.close_stdin = True
        if proc.close_stdin and not proc.stdin_queue:
            self._close_stdin_now(proc)

    def _close_stdin_now(self, proc: _Proc) -> None:
        fd = proc.stdin_fd
        proc.stdin_fd = None
        if fd is not None and fd != proc.pty_fd:
            _close(fd)

    def _reap(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is not None:
                continue
            try:
                rc = proc.popen.poll()
            except ChildProcessError:  # a cell waited for it first: its status is lost
                rc = -255
            if rc is None:
                continue
            # What it wrote before it exited is in the pipes now: take it before saying so.
            for fd in list(proc.reads):
                self._read_output(proc, fd, drain=True)
            proc.returncode = rc
            proc.stdin_queue.clear()
            self._close_stdin_now(proc)
            if proc.pty_fd is not None:
                # A program it left behind may still hold the terminal: it is not read after.
                proc.reads.pop(proc.pty_fd, None)
                _close(proc.pty_fd)
                proc.pty_fd = proc.stdin_fd = None
                proc.out.eof = True

    def _read_inotify(self) -> None:
        assert self.inotify is not None
        try:
            buf = os.read(self.inotify, 65536)
        except OSError:
            return
        at = 0
        while at + 16 <= len(buf):
            wd = int.from_bytes(buf[at : at + 4], sys.byteorder, signed=True)
            mask = int.from_bytes(buf[at + 4 : at + 8], sys.byteorder)
            size = int.from_bytes(buf[at + 12 : at + 16], sys.byteorder)
            name = os.fsdecode(buf[at + 16 : at + 16 + size].rstrip(b"\0"))
            at += 16 + size
            if mask & _IN_Q_OVERFLOW:
                for w in self.watches.values():
                    w.dropped += 1
                continue
            for w in list(self.watches.values()):
                if wd in w.dirs:
                    self._inotify_event(w, wd, mask, name)

    def _inotify_event(self, w: _Watch, wd: int, mask: int, name: str) -> None:
        if mask & (_IN_IGNORED | _IN_DELETE_SELF):
            w.dirs.pop(wd, None)
            return
        path = os.path.join(w.dirs[wd], name) if name else w.dirs[wd]
        is_dir = bool(mask & _IN_ISDIR)
        if mask & (_IN_CREATE | _IN_MOVED_TO):
            w.add("create", path, is_dir)
            if is_dir and w.recursive and name not in _OWN_DIRS:
                self._add_tree(w, path)
        if mask & _IN_MODIFY:
            w.add("write", path, is_dir)
        if mask & _IN_ATTRIB:
            w.add("chmod", path, is_dir)
        if mask & _IN_MOVED_FROM:
            w.add("rename", path, is_dir)
        if mask & _IN_DELETE:
            w.add("remove", path, is_dir)

    def _poll_watches(self) -> None:
        for w in self.watches.values():
            if w.snapshot is None:
                continue
            now = _snapshot(w.path, w.recursive)
            for path, (size, mtime, is_dir) in sorted(now.items()):
                old = w.snapshot.get(path)
                if old is None:
                    w.add("create", path, is_dir)
                elif not is_dir and old[:2] != (size, mtime):
                    w.add("write", path, is_dir)
            for path in sorted(set(w.snapshot) - set(now)):
                w.add("remove", path, w.snapshot[path][2])
            w.snapshot = now


def _snapshot(top: str, recursive: bool) -> dict[str, tuple[int, int, bool]]:
    seen: dict[str, tuple[int, int, bool]] = {}
    todo = [top]
    while todo and len(seen) < 100000:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = e.is_dir(follow_symlinks=False)
            seen[e.path] = (st.st_size, st.st_mtime_ns, is_dir)
            if is_dir and recursive and e.name not in _OWN_DIRS:
                todo.append(e.path)
    return seen


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            try:  # noqa: SIM105 - closing what may be closed already
                os.close(fd)
            except OSError:
                pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _set_size(fd: int, rows: int, cols: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    # In the child, after setsid: its stdin (the terminal) becomes its controlling tty, so job
    # control, ^C and `tty` work as in a terminal. Modules imported in the parent: nothing to load.
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


_OPS = ("spawn", "list", "read", "write", "close_stdin", "signal", "resize", "watch",
        "watch_events", "unwatch")  # fmt: skip


def ends(m: Manager, budget: int) -> list[dict[str, Any]]:
    """The processes that exited since the last reply, each once, with the tail of each stream
    (base64 of at most :data:`END_TAIL` bytes; fewer so that all of them fit ``budget`` bytes of
    reply): the host records each one's end. What does not fit goes with a later reply."""
    told: list[dict[str, Any]] = []
    with m.lock:
        for proc in m.procs.values():
            if proc.returncode is None or proc.end_told:
                continue
            tail = min(END_TAIL, budget * 3 // 8)
            if tail < 64:
                break
            out, err = proc.out, proc.err
            told.append(
                {
                    **proc.info(),
                    "ended_at": time.time(),
                    "stdout": out.read(max(out.start, out.end - tail), tail),
                    "stderr": err.read(max(err.start, err.end - tail), tail),
                }
            )
            proc.end_told = True
            budget -= tail * 8 // 3 + 1024
    return told


def manager() -> Manager:
    """The kernel's one manager, made (and its pump started) on first use."""
    found: Manager | None = globals().get("_MANAGER")
    if found is None:
        import fcntl  # noqa: F401 - loaded here, not in a forked child (see _take_terminal)
        import termios  # noqa: F401

        found = globals()["_MANAGER"] = Manager()
    return found


def main(request_json: str) -> None:
    """Serve one request and print its reply line: ``{"ok": true, ...}`` or ``{"ok": false,
    "kind": KIND, "error": MESSAGE}``."""
    try:
        r = json.loads(request_json)
        op = r.get("op")
        if op not in _OPS:
            raise Failed("protocol", f"unknown operation {op!r}")
        m = manager()
        reply = {"ok": True, **getattr(m, op)(r)}
        reply["ends"] = ends(m, int(r.get("ends_budget", 0)))
    except Failed as exc:
        reply = {"ok": False, "kind": exc.kind, "error": str(exc)}
    except Exception as exc:
        reply = {"ok": False, "kind": "error", "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()
