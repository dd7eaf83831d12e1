"""The guest half of the run's sockets (the host's is ``relay.py``): :class:`Forwarder`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct

from .bridge import SOCKETS_DIR, loopback_up, start_bridge

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .job import Job
    from .port import Port

RELAY_ID = struct.Struct(">I")
RELAY_WINDOW = 256 << 10
RELAY_CHUNK = 64 << 10
RELAY_GRANT_AT = RELAY_WINDOW // 4
RELAY_MAX_CONNECTIONS = 128


class Conn:
    """One connection a program made, and its flow-control state."""

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
    /run/sandcell/egress.sock, tools.sock and ingress.sock (as the run asks), and carries each
    connection a program (or the ingress agent) makes over the port as ``R`` frames, with the
    host's credit-based flow control. A loopback bridge (the host's ``sandcell_bridge.py``,
    :mod:`.bridge`) serves 127.0.0.1:PORT for HTTP clients; a session's ingress agent
    (``sandcell_ingress.py``) carries the host's connections to the program's servers.

    The owner's select loop asks for :meth:`rfds` and :meth:`wfds`, hands what is ready to
    :meth:`ready`, and the host's ``R`` frames to :meth:`on_host`."""

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
        served = (
            ("egress.sock", b"e", spec["egress"]),
            ("tools.sock", b"t", spec["tools"]),
            ("ingress.sock", b"i", spec.get("ingress")),
        )
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
        if spec.get("ingress_argv"):
            # Connected (its hello waiting in the listener's backlog) before the program starts:
            # the first connection the host's gate sees is the agent's.
            start_bridge(spec, lim, "ingress_argv")
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
