"""The host side of a session's ports: :class:`IngressGate` serves ``ingress.sock`` to the
sandbox's ingress agent (:mod:`sandcell.network.ingress_agent`) and connects callers to the
program's servers inside, recording every connection.

Usage::

    gate = IngressGate(ports=(8000,), socket_path=run_dir / "ingress.sock")
    gate.start()                      # the sandbox's agent connects and says hello
    sock = gate.connect(8000, by="tenant-1")   # a stream to 127.0.0.1:8000 in the sandbox
    gate.records                      # one IngressRecord per connection, allowed or refused
    gate.stop()

Protocol (lines of ASCII, then raw bytes): the first connection accepted is the control one and
must say ``hello``; the agent starts before the program, so it is the agent's. A later
``hello``, an unknown id, or anything else is closed unread. The gate sends ``open ID PORT`` on
the control connection (ID: 32 random hex digits); the agent answers on a new connection with
``data ID`` followed by the stream, or ``fail ID REASON``.

Everything on the socket is hostile (the program can connect to it as well as the agent): lines
are capped, a connection that says nothing within :data:`FIRST_LINE_S` is closed, and only ids
the gate is waiting for are accepted, once each. The sandbox cannot open a connection to the
host: data flows only on connections the gate asked for. Threads, not asyncio: a caller gets a
blocking socket, and connections are the host's own (at most :data:`MAX_CONCURRENT`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sandcell.errors import ConfigError, InfraError

FIRST_LINE_S = 10.0
"""How long a new connection on ``ingress.sock`` may take to say what it is."""
AGENT_WAIT_S = 30.0
"""How long :meth:`IngressGate.connect` waits for the agent's hello (a microVM under TCG starts
it seconds after the sandbox is up)."""
OPEN_TIMEOUT_S = 30.0
"""How long the agent may take to answer an ``open``."""
MAX_CONCURRENT = 64
MAX_GREETING = 32
"""New connections on the socket still to say what they are; past this one is closed at once,
so a program that floods the socket costs the host no more threads (it only delays its own
answers)."""
MAX_RECORDS = 10_000
"""Connections kept in the record; past this they are counted (``dropped``), not listed."""
_LINE_MAX = 256
_CHUNK = 64 * 1024


class PortNotAllowed(ConfigError):
    """The session's profile does not list the port in ``[ingress] ports`` (or lists none)."""


class PortClosed(ConfigError):
    """Nothing accepted the connection on that port inside the sandbox (no server listens)."""


class IngressUnavailable(InfraError):
    """The sandbox's ingress agent is not connected (it did not start, or it is gone)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressRecord:
    """One connection (or refused attempt) from outside to a port of the sandbox."""

    seq: int
    """Order of arrival in the session, from 1."""
    port: int
    allowed: bool
    """Whether a stream to the program's server was opened."""
    reason: str
    """Why it was refused, or how it ended (``closed``)."""
    by: str | None
    """Who asked (a tenant, ``local``, a forwarder), as the caller said."""
    bytes_to_sandbox: int = 0
    bytes_from_sandbox: int = 0
    started_at: float
    """Wall-clock time (Unix seconds) it was asked for."""
    ended_at: float

    def to_record(self) -> dict[str, object]:
        """Plain JSON-ready data, for the run record."""
        return asdict(self)


class _Waiting:
    """An ``open`` sent to the agent, until it answers."""

    __slots__ = ("answered", "reason", "sock")

    def __init__(self) -> None:
        self.answered = threading.Event()
        self.sock: socket.socket | None = None
        self.reason = ""


class IngressGate:
    """The host end of one session's ``ingress.sock`` (see the module). Thread-safe."""

    def __init__(self, *, ports: tuple[int, ...], socket_path: Path) -> None:
        self.ports = tuple(ports)
        self.socket_path = socket_path
        self._lock = threading.Lock()
        self._hello = threading.Condition(self._lock)
        self._listener: socket.socket | None = None
        self._control: socket.socket | None = None
        self._control_gone = False
        self._accepted = 0
        self._waiting: dict[str, _Waiting] = {}
        self._live: set[socket.socket] = set()
        self._records: list[IngressRecord] = []
        self._dropped = 0
        self._seq = 0
        self._closed = False
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._carrying = 0
        self._greeting = 0
        self._carried = threading.Condition(self._lock)

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> None:
        """Listen on the socket path (owner only, like the egress proxy's).

        Raises:
            ConfigError: the path exists already.
            InfraError: it cannot be served.
        """
        if self.socket_path.exists():
            raise ConfigError(f"the ingress socket {str(self.socket_path)!r} exists already")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.socket_path))
        except OSError as exc:
            listener.close()
            raise InfraError(f"the ingress socket cannot be served: {exc}") from exc
        finally:
            os.umask(old)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, name="sandcell-ingress", daemon=True).start()

    def stop(self) -> None:
        """Stop serving: the agent's control connection and every carried stream end. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            socks = [s for s in (self._listener, self._control) if s is not None]
            socks += list(self._live)
            for waiting in self._waiting.values():
                waiting.reason = "the session ended"
                waiting.answered.set()
            self._hello.notify_all()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        # The streams just cut end in their records: wait for those, so the last take has them.
        with self._carried:
            self._carried.wait_for(lambda: self._carrying == 0, timeout=5.0)

    @property
    def records(self) -> tuple[IngressRecord, ...]:
        """Connections ended (or refused) so far, in that order."""
        with self._lock:
            return tuple(self._records)

    @property
    def dropped(self) -> int:
        """Connections past :data:`MAX_RECORDS`: counted, not listed."""
        return self._dropped

    # -- callers -----------------------------------------------------------------------------

    def connect(self, port: int, *, by: str | None = None) -> socket.socket:
        """A connected stream to 127.0.0.1:``port`` inside the sandbox (the caller closes it).

        Raises:
            PortNotAllowed: the profile does not list ``port``.
            PortClosed: nothing listens there (or the server refused).
            IngressUnavailable: the agent is not connected, did not answer, or the gate stopped.
        """
        mine, theirs = socket.socketpair()
        try:
            self.serve(port, theirs, by=by)
        except BaseException:
            mine.close()
            theirs.close()
            raise
        return mine

    def serve(self, port: int, client: socket.socket, *, by: str | None = None) -> None:
        """Carry ``client`` (a connected stream the gate then owns and closes) to ``port`` in
        the sandbox, on threads of the gate's; raises as :meth:`connect` before taking it."""
        started = time.time()
        if port not in self.ports:
            allowed = ", ".join(map(str, self.ports)) or "none"
            why = f"port {port} is not in the profile's [ingress] ports ({allowed})"
            self._refused(port, by, started, why)
            raise PortNotAllowed(why)
        if not self._slots.acquire(blocking=False):
            why = f"{MAX_CONCURRENT} connections to the sandbox are open already"
            self._refused(port, by, started, why)
            raise IngressUnavailable(why)
        try:
            upstream = self._open(port, by, started)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._carrying += 1
        threading.Thread(
            target=self._carry,
            args=(client, upstream, port, by, started),
            name="sandcell-ingress-carry",
            daemon=True,
        ).start()

    def _open(self, port: int, by: str | None, started: float) -> socket.socket:
        conn_id = secrets.token_hex(16)
        waiting = _Waiting()
        with self._lock:
            deadline = time.monotonic() + AGENT_WAIT_S
            while self._control is None and not self._control_gone and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._hello.wait(left)
            control = self._control
            if self._closed or control is None:
                why = (
                    "the session has ended"
                    if self._closed
                    else "the sandbox's ingress agent is not connected"
                )
                self._refused_locked(port, by, started, why)
                raise IngressUnavailable(why)
            self._waiting[conn_id] = waiting
        try:
            try:
                control.sendall(f"open {conn_id} {port}\n".encode("ascii"))
            except OSError as exc:
                why = f"the sandbox's ingress agent is gone ({exc.strerror or exc})"
                self._refused(port, by, started, why)
                raise IngressUnavailable(why) from None
            if not waiting.answered.wait(OPEN_TIMEOUT_S):
                why = f"the sandbox's ingress agent did not answer within {OPEN_TIMEOUT_S:g} s"
                self._refused(port, by, started, why)
                raise IngressUnavailable(why)
        finally:
            with self._lock:
                self._waiting.pop(conn_id, None)
        if waiting.sock is None:
            why = waiting.reason
            self._refused(port, by, started, why)
            if self._closed:
                raise IngressUnavailable(why)
            raise PortClosed(f"nothing accepted a connection on port {port} in the sandbox: {why}")
        return waiting.sock

    # -- the socket's side -------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._accepted += 1
                first = self._accepted == 1
                crowded = self._greeting >= MAX_GREETING
                if not crowded:
                    self._greeting += 1
            if crowded:
                conn.close()
                continue
            threading.Thread(
                target=self._greet, args=(conn, first), name="sandcell-ingress-greet", daemon=True
            ).start()

    def _greet(self, conn: socket.socket, first: bool) -> None:
        """Read what a new connection is; anything but what the gate waits for is closed."""
        try:
            line = _first_line(conn)
        finally:
            with self._lock:
                self._greeting -= 1
        words = line.split(" ", 2) if line is not None else []
        if first and words == ["hello"]:
            self._on_control(conn)
            return
        if len(words) >= 2 and words[0] in ("data", "fail"):
            with self._lock:
                waiting = self._waiting.pop(words[1], None)
            if waiting is not None:
                if words[0] == "data":
                    conn.settimeout(None)
                    waiting.sock = conn
                else:
                    waiting.reason = _printable(words[2] if len(words) > 2 else "refused")
                    conn.close()
                waiting.answered.set()
                return
        conn.close()

    def _on_control(self, conn: socket.socket) -> None:
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._control = conn
            self._hello.notify_all()
        conn.settimeout(None)
        # The agent sends nothing more: end of stream (or anything at all) means it is gone.
        with contextlib.suppress(OSError):
            conn.recv(1)
        with self._lock:
            self._control = None
            self._control_gone = True
            for waiting in self._waiting.values():
                waiting.reason = "the sandbox's ingress agent is gone"
                waiting.answered.set()
        conn.close()

    # -- streams -----------------------------------------------------------------------------

    def _carry(
        self,
        client: socket.socket,
        upstream: socket.socket,
        port: int,
        by: str | None,
        started: float,
    ) -> None:
        """Copy both ways. The connection is recorded once the sandbox's side has ended, before
        the caller is told so (its end of stream): a caller that saw the end finds the record
        taken by whatever it does next. Bytes the caller sends after that go nowhere and are
        not counted."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._live.update((client, upstream))
        counts = [0, 0]

        def back() -> None:
            ended = _copy(upstream, client, counts, 1, half_close=False)
            self._record_carried(port, by, started, counts)
            if ended:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_WR)

        if closed:
            self._record_carried(port, by, started, counts)
        else:
            thread = threading.Thread(target=back, name="sandcell-ingress-back", daemon=True)
            thread.start()
            _copy(client, upstream, counts, 0)
            thread.join()
        with self._lock:
            self._live.difference_update((client, upstream))
        for sock in (client, upstream):
            sock.close()
        self._slots.release()
        with self._lock:
            self._carrying -= 1
            self._carried.notify_all()

    def _record_carried(self, port: int, by: str | None, started: float, counts: list[int]) -> None:
        with self._lock:
            self._record_locked(
                IngressRecord(
                    seq=0,
                    port=port,
                    allowed=True,
                    reason="closed" if not self._closed else "the session ended",
                    by=by,
                    bytes_to_sandbox=counts[0],
                    bytes_from_sandbox=counts[1],
                    started_at=started,
                    ended_at=time.time(),
                )
            )

    def _refused(self, port: int, by: str | None, started: float, why: str) -> None:
        with self._lock:
            self._refused_locked(port, by, started, why)

    def _refused_locked(self, port: int, by: str | None, started: float, why: str) -> None:
        self._record_locked(
            IngressRecord(
                seq=0,
                port=port,
                allowed=False,
                reason=why,
                by=by,
                started_at=started,
                ended_at=time.time(),
            )
        )

    def _record_locked(self, record: IngressRecord) -> None:
        self._seq += 1
        if len(self._records) >= MAX_RECORDS:
            self._dropped += 1
            return
        fields = record.to_record()
        fields["seq"] = self._seq
        self._records.append(IngressRecord(**fields))  # type: ignore[arg-type]


def _first_line(conn: socket.socket) -> str | None:
    """The connection's first line (ASCII, without its newline), read byte by byte so that not
    one byte of a stream after it is taken; None when it is not one within the limits."""
    conn.settimeout(FIRST_LINE_S)
    deadline = time.monotonic() + FIRST_LINE_S
    line = bytearray()
    try:
        while len(line) <= _LINE_MAX and time.monotonic() < deadline:
            byte = conn.recv(1)
            if not byte:
                return None
            if byte == b"\n":
                return line.decode("ascii") if line.isascii() else None
            line += byte
    except OSError:
        return None
    return None


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)[:120]


def _copy(
    source: socket.socket,
    sink: socket.socket,
    counts: list[int],
    slot: int,
    *,
    half_close: bool = True,
) -> bool:
    """Copy until end of stream (then half-close ``sink``, unless not ``half_close``) or an
    error (then end both), counting bytes in ``counts[slot]``; True at an end of stream."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
            counts[slot] += len(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return False
    if half_close:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
    return True


__all__ = [
    "IngressGate",
    "IngressRecord",
    "IngressUnavailable",
    "PortClosed",
    "PortNotAllowed",
]
