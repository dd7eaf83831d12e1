"""The host half of a VM's ways out: the run's sockets carried over the agent channel.

A guest has no network device and cannot see the host's socket directory. The guest agent
listens on ``/run/sandcell/egress.sock``, ``tools.sock`` and (a session with ports)
``ingress.sock`` itself and carries each connection it accepts over the agent channel as ``R``
frames: one op byte, a 4-byte connection id and data.
:class:`Pump` takes over the channel once the program is about to start (after ``G``): one thread
reads every frame, handles the relay's here and queues the others for the run's usual reader,
connects each connection the guest opens to ``egress.sock``, ``tools.sock`` or ``ingress.sock``
of the run's host directory, and carries bytes both ways. The session's ingress agent in the
guest reaches the host's ingress gate this way: the host never opens a connection into the
guest, it asks the agent on the agent's own connection.

Flow control is by credit, per connection and direction: a side may have at most
:data:`WINDOW` bytes in flight, and the receiver grants bytes back as it writes them out. The
host never blocks on a write (the channel's and each socket's bytes wait in buffers the credits
bound), so a program that floods, or a host service that stops reading, stalls only its own
connection. What the host holds for a run is bounded: at most :data:`WINDOW` bytes per
connection and direction, :data:`MAX_CONNECTIONS` connections (64 MiB in all, worst case), and
it reads the channel only while fewer than :data:`PENDING_CAP` frames wait for the run's reader.
The agent carries its own copy of the window and the limits (it imports nothing); a unit test
keeps the two equal.

Everything the guest sends is hostile: an unknown op, a short frame, a connection id that was
never opened (ids only grow), data beyond the granted credit, a credit for bytes never sent or a
target the run does not serve is a protocol error that ends the run (:class:`ChannelError`).
Frames for a connection the host already closed are dropped (the two sides close independently).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.backends.microvm import channel
from sandcell.run_sockets import (
    BRIDGE_FILE,
    EGRESS_SOCKET,
    INGRESS_FILE,
    INGRESS_SOCKET,
    TOOLS_FILE,
    TOOLS_SOCKET,
    SandboxSockets,
)

RELAY = b"R"
OPEN = b"o"
"""guest -> host: a program connected; data: the target (``e`` egress, ``t`` tools, ``i``
ingress)."""
DATA = b"d"
SHUT = b"h"
"""No more data from the sender on this connection (a half-close)."""
CLOSE = b"c"
"""The sender dropped the connection (an error, or a refused open): discard it."""
CREDIT = b"w"
"""4 bytes: how many more bytes the receiver may be sent."""
READY = b"r"
"""guest -> host, id 0: the guest's sockets listen and the bridge is up (JSON data)."""
ID = struct.Struct(">I")
WINDOW = 256 << 10
CHUNK = 64 << 10
GRANT_AT = WINDOW // 4
MAX_CONNECTIONS = 128
PENDING_CAP = 16
TARGETS = {b"e": EGRESS_SOCKET, b"t": TOOLS_SOCKET, b"i": INGRESS_SOCKET}
GUEST_PYTHON = "/usr/bin/python3"
"""The guest's base interpreter (the agent's own): the bridge needs only the standard library."""
_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def relay_frame(op: bytes, conn_id: int, data: bytes = b"") -> bytes:
    return channel.encode(RELAY, op + ID.pack(conn_id) + data)


def guest_spec(sockets: SandboxSockets) -> dict[str, object]:
    """What the agent needs to serve ``sockets`` in the guest: which sockets, and the files of
    ``/run/sandcell/lib`` (the bridge, the client and a session's ingress agent, standard
    library only)."""
    lib = {}
    files = (BRIDGE_FILE, TOOLS_FILE, *((INGRESS_FILE,) if sockets.ingress else ()))
    for rel in files:
        lib[Path(rel).name] = (sockets.host_dir / rel).read_text(encoding="utf-8")
    return {
        "egress": sockets.egress,
        "tools": sockets.tools,
        "ingress": bool(sockets.ingress),
        "lib": lib,
        "bridge_argv": sockets.bridge_argv(GUEST_PYTHON),
        "ingress_argv": sockets.ingress_argv(GUEST_PYTHON),
    }


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    to_host: bytearray = field(default_factory=bytearray)
    """Bytes from the guest, waiting to be written to the host socket."""
    guest_may_send: int = WINDOW
    """Credit the guest holds: more than this in one go is a protocol error."""
    to_grant: int = 0
    """Written to the host socket, not yet granted back to the guest."""
    may_send: int = WINDOW
    """Credit the guest granted: how much more the host may send it."""
    guest_shut: bool = False
    host_shut: bool = False
    """The host socket's write side is shut (after the guest's SHUT and the buffer)."""
    host_eof: bool = False
    """The host socket reached its end (SHUT sent to the guest)."""


class Pump:
    """Owns a :class:`~.channel.Channel` from :meth:`start` until :meth:`stop` (see module)."""

    def __init__(self, chan: channel.Channel, sockets: SandboxSockets) -> None:
        self.chan = chan
        self.sockets = sockets
        self.ready: dict[str, object] | None = None
        """The guest's READY report, once it came."""
        self.opened = 0
        self._targets = {
            k: v
            for k, v in TARGETS.items()
            if (v == EGRESS_SOCKET and sockets.egress)
            or (v == TOOLS_SOCKET and sockets.tools)
            or (v == INGRESS_SOCKET and sockets.ingress)
        }
        self._conns: dict[int, _Conn] = {}
        self._last_id = 0
        self._outbox = bytearray()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._error: channel.ChannelError | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        chan.reader.allowed = chan.reader.allowed | {RELAY}

    # -- the consumer's side (the run's thread) ----------------------------------------------

    def start(self) -> None:
        self.chan.pump = self
        self._thread = threading.Thread(target=self._loop, name="sandcell-vm-relay", daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        """Queue bytes for the guest (never blocks: what the run sends is its own to bound)."""
        with self._lock:
            if self._error is not None:
                raise self._error
            self._outbox += data
        self._wake()

    def recv(self, deadline: float) -> tuple[bytes, bytes]:
        """The next frame that is not the relay's; ChannelTimeout at the deadline."""
        with self._cond:
            while not self.chan.pending:
                if self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise channel.ChannelTimeout("no frame before the deadline")
                self._cond.wait(left)
            frame = self.chan.pending.pop(0)
            unpause = len(self.chan.pending) == PENDING_CAP - 1
        if unpause:
            self._wake()
        return frame

    def stop(self) -> None:
        """Stop the thread and close every host socket (idempotent)."""
        with self._lock:
            self._stopping = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        for conn in self._conns.values():
            conn.sock.close()
        self._conns.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # -- the thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except channel.ChannelError as exc:
            self._fail(exc)
        except Exception as exc:  # any bug here must end the run, not hang it
            self._fail(channel.ChannelError(f"the relay failed: {type(exc).__name__}: {exc}"))

    def _fail(self, exc: channel.ChannelError) -> None:
        for conn in self._conns.values():
            conn.sock.close()
        self._conns.clear()
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def _serve(self) -> None:
        chan_fd = self.chan.sock.fileno()
        while True:
            with self._lock:
                if self._stopping:
                    return
                paused = len(self.chan.pending) >= PENDING_CAP
                writing = bool(self._outbox)
            poll = select.poll()
            poll.register(self._wake_r, select.POLLIN)
            events = (0 if paused else select.POLLIN) | (select.POLLOUT if writing else 0)
            if events:
                poll.register(chan_fd, events)
            by_fd: dict[int, int] = {}
            for cid, conn in self._conns.items():
                want = 0
                if conn.may_send > 0 and not conn.host_eof:
                    want |= select.POLLIN
                if conn.to_host:
                    want |= select.POLLOUT
                if want:
                    by_fd[conn.sock.fileno()] = cid
                    poll.register(conn.sock, want)
            # A paused reader is not woken when the run's thread takes a frame directly.
            for fd, ev in poll.poll(20 if paused else 1000):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif fd == chan_fd:
                    if ev & select.POLLOUT:
                        self._flush()
                    if ev & _POLL_IN and not paused:
                        self._read_channel()
                    elif paused and ev & (select.POLLHUP | select.POLLERR):
                        time.sleep(0.02)  # the end is read once the run's reader catches up
                elif fd in by_fd:
                    self._on_host_socket(by_fd[fd], ev)
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            if not self._outbox:
                return
            try:
                n = self.chan.sock.send(self._outbox[: 1 << 18])
            except BlockingIOError:
                return
            except OSError as exc:
                raise channel.ChannelError(f"the channel failed: {exc}") from None
            del self._outbox[:n]

    def _queue(self, data: bytes) -> None:
        with self._lock:
            self._outbox += data

    def _read_channel(self) -> None:
        try:
            data = self.chan.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            raise channel.ChannelError(f"the channel failed: {exc}") from None
        if not data:
            self.chan.closed = True
            raise channel.ChannelError("the guest closed the channel")
        others: list[tuple[bytes, bytes]] = []
        try:
            for kind, payload in self.chan.reader.feed(data):
                if kind == RELAY:
                    self.on_guest(payload)
                else:
                    others.append((kind, payload))
        finally:
            # What came before a broken frame is still the run's, in order.
            if others:
                with self._cond:
                    self.chan.pending.extend(others)
                    self._cond.notify_all()

    # -- frames from the guest -------------------------------------------------------------------

    def on_guest(self, payload: bytes) -> None:
        """One relay frame from the guest, checked (see module)."""
        if len(payload) < 1 + ID.size:
            raise _violation(f"a relay frame of {len(payload)} bytes")
        op = payload[:1]
        (cid,) = ID.unpack_from(payload, 1)
        data = payload[1 + ID.size :]
        if op == READY:
            self._on_ready(cid, data)
            return
        if op == OPEN:
            self._open(cid, data)
            return
        if cid > self._last_id or cid == 0:
            raise _violation(f"{op!r} for connection {cid}, which was never opened")
        conn = self._conns.get(cid)
        if conn is None:
            if op not in (DATA, SHUT, CLOSE, CREDIT):
                raise _violation(f"an unknown relay op {op!r}")
            return  # closed here already; the guest had not heard yet
        if op == DATA:
            if not data or len(data) > conn.guest_may_send or conn.guest_shut:
                raise _violation(
                    f"{len(data)} bytes on connection {cid} with a credit of "
                    f"{conn.guest_may_send}" + (" after its end" if conn.guest_shut else "")
                )
            conn.guest_may_send -= len(data)
            conn.to_host += data
        elif op == SHUT:
            if data:
                raise _violation("data in a SHUT frame")
            conn.guest_shut = True
            self._maybe_shut(cid, conn)
        elif op == CLOSE:
            self._drop(cid)
        elif op == CREDIT:
            if len(data) != ID.size:
                raise _violation(f"a credit of {len(data)} bytes")
            (n,) = ID.unpack(data)
            if n == 0 or conn.may_send + n > WINDOW:
                raise _violation(f"a credit of {n} bytes for bytes never sent")
            conn.may_send += n
        else:
            raise _violation(f"an unknown relay op {op!r}")

    def _on_ready(self, cid: int, data: bytes) -> None:
        if cid != 0 or self.ready is not None:
            raise _violation("a second or misplaced READY")
        try:
            doc = json.loads(data)
        except ValueError:
            raise _violation("a READY that is not JSON") from None
        if not isinstance(doc, dict):
            raise _violation("a READY that is not an object")
        self.ready = {k: doc[k] for k in ("bridge_port",) if isinstance(doc.get(k), int)}

    def _open(self, cid: int, data: bytes) -> None:
        if cid <= self._last_id:
            raise _violation(f"connection id {cid} reused (the last was {self._last_id})")
        name = self._targets.get(data)
        if name is None:
            raise _violation(f"a connection to {data[:16]!r}, which this run does not serve")
        self._last_id = cid
        if len(self._conns) >= MAX_CONNECTIONS:
            self._queue(relay_frame(CLOSE, cid))
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(str(self.sockets.host_dir / name))
        except OSError:
            # The service is gone or its backlog is full: the program's connection is refused.
            sock.close()
            self._queue(relay_frame(CLOSE, cid))
            return
        self._conns[cid] = _Conn(sock=sock)
        self.opened += 1

    # -- the host sockets ------------------------------------------------------------------------

    def _on_host_socket(self, cid: int, events: int) -> None:
        conn = self._conns.get(cid)
        if conn is None:
            return
        try:
            if events & select.POLLOUT or (events & (select.POLLERR | select.POLLHUP)):
                self._write_host(cid, conn)
            if cid in self._conns and events & _POLL_IN and conn.may_send > 0:
                self._read_host(cid, conn)
        except _GONE:
            self._abort(cid)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return
            self._abort(cid)

    def _write_host(self, cid: int, conn: _Conn) -> None:
        if conn.to_host:
            n = conn.sock.send(conn.to_host)
            del conn.to_host[:n]
            conn.to_grant += n
            # Granted in batches: once the buffer is empty, what is not yet granted is at least
            # GRANT_AT whenever the guest has no credit left, so it never waits on a grant.
            if conn.to_grant >= GRANT_AT:
                self._queue(relay_frame(CREDIT, cid, ID.pack(conn.to_grant)))
                conn.guest_may_send += conn.to_grant
                conn.to_grant = 0
        self._maybe_shut(cid, conn)

    def _read_host(self, cid: int, conn: _Conn) -> None:
        if conn.host_eof:
            return
        data = conn.sock.recv(min(conn.may_send, CHUNK))
        if data:
            conn.may_send -= len(data)
            self._queue(relay_frame(DATA, cid, data))
            return
        conn.host_eof = True
        self._queue(relay_frame(SHUT, cid))
        self._maybe_done(cid, conn)

    def _maybe_shut(self, cid: int, conn: _Conn) -> None:
        if conn.guest_shut and not conn.to_host and not conn.host_shut:
            conn.host_shut = True
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
        self._maybe_done(cid, conn)

    def _maybe_done(self, cid: int, conn: _Conn) -> None:
        if conn.host_shut and conn.host_eof:
            conn.sock.close()
            del self._conns[cid]

    def _abort(self, cid: int) -> None:
        self._drop(cid)
        self._queue(relay_frame(CLOSE, cid))

    def _drop(self, cid: int) -> None:
        conn = self._conns.pop(cid, None)
        if conn is not None:
            conn.sock.close()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def buffered_bytes(self) -> int:
        """What the relay holds for its connections (bounded by the credits)."""
        with self._lock:
            out = len(self._outbox)
        return out + sum(len(c.to_host) for c in list(self._conns.values()))


def _violation(what: str) -> channel.ChannelError:
    return channel.ChannelError(f"the guest broke the relay protocol: {what}")


__all__ = [
    "CHUNK",
    "MAX_CONNECTIONS",
    "RELAY",
    "WINDOW",
    "Pump",
    "guest_spec",
    "relay_frame",
]
