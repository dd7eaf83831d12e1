"""The ingress agent: inside a session's sandbox, it carries the host's connections to the
program's servers on loopback (the egress bridge's way, in reverse).

The sandbox has no network; the host reaches a server the program started on 127.0.0.1:PORT
only through this agent, which reaches the host only through the session's ``ingress.sock``
(the host's :mod:`sandcell.network.ingress`). It keeps one control connection, on which it
says ``hello`` and the host sends ``open ID PORT`` lines; for each, it connects to
127.0.0.1:PORT (only a port on its command line: the profile's ``[ingress] ports``), opens a
new connection to the socket, says ``data ID`` (or ``fail ID REASON`` when nothing listens) and
copies bytes both ways until either side closes. It decides nothing the host does not check
again, and a program that talks to the socket itself gains nothing: the host takes the first
connection for the control one (this agent's, made before the program starts) and matches
data connections by the random ids it sent.

Standard library only, so it runs under the sandbox's own interpreter::

    python3 -I sandcell_ingress.py /run/sandcell/ingress.sock 8000,8080

It prints one line (the number of ports it serves) once its control connection is up, as the
egress bridge prints its port: every rung's starter waits for that line.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

_CHUNK = 64 * 1024
_LINE_MAX = 256
_CONNECT_TIMEOUT_S = 10.0
_MAX_OPEN = 64
"""Connections carried at once; the host keeps to its own cap, this bounds threads if not."""


class Agent:
    """One control connection to ``socket_path``, carrying ``open`` requests to ``ports``."""

    def __init__(self, socket_path: str, ports: frozenset[int]) -> None:
        self._path = socket_path
        self._ports = ports
        self._slots = threading.BoundedSemaphore(_MAX_OPEN)
        self._control = self._connect_host()
        self._control.sendall(b"hello\n")

    def _connect_host(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        return sock

    def serve(self) -> None:
        """Read ``open`` lines until the host closes the control connection."""
        with self._control:
            self._serve()

    def _serve(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._control.recv(4096)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                self._on_line(line)
            if len(buf) > _LINE_MAX:
                return  # not the host speaking: stop rather than guess

    def _on_line(self, line: bytes) -> None:
        parts = line.decode("ascii", "replace").split()
        if len(parts) != 3 or parts[0] != "open" or not parts[2].isdigit():
            return
        conn_id, port = parts[1], int(parts[2])
        if not conn_id.isalnum() or len(conn_id) > 64:
            return
        if not self._slots.acquire(blocking=False):
            self._answer_fail(conn_id, "too many connections at once")
            return
        threading.Thread(target=self._open, args=(conn_id, port), daemon=True).start()

    def _open(self, conn_id: str, port: int) -> None:
        try:
            if port not in self._ports:
                self._answer_fail(conn_id, "port not served by the ingress agent")
                return
            try:
                server = socket.create_connection(("127.0.0.1", port), _CONNECT_TIMEOUT_S)
            except OSError as exc:
                self._answer_fail(conn_id, exc.strerror or type(exc).__name__)
                return
            server.settimeout(None)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                host = self._connect_host()
                host.sendall(f"data {conn_id}\n".encode("ascii"))
            except OSError:
                server.close()
                return
            back = threading.Thread(target=_copy, args=(server, host), daemon=True)
            back.start()
            _copy(host, server)
            back.join()
            server.close()
            host.close()
        finally:
            self._slots.release()

    def _answer_fail(self, conn_id: str, reason: str) -> None:
        text = " ".join(reason.split())[:120] or "refused"
        with contextlib.suppress(OSError):
            host = self._connect_host()
            try:
                host.sendall(f"fail {conn_id} {text}\n".encode("ascii", "replace"))
            finally:
                host.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Copy until end of stream (then half-close ``sink``) or an error (then end both)."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def parse_ports(text: str) -> frozenset[int]:
    """``8000,8080`` -> the ports; ValueError for anything else."""
    ports = frozenset(int(p) for p in text.split(",") if p)
    if not ports or not all(0 < p < 65536 for p in ports):
        raise ValueError(f"bad port list {text!r}")
    return ports


def main(argv: list[str]) -> int:
    """``ingress_agent.py SOCKET PORTS``: print the number of ports once connected to the host,
    then carry connections until the host closes the control connection."""
    if len(argv) != 2:
        print("usage: sandcell_ingress.py SOCKET PORT[,PORT...]", file=sys.stderr)
        return 2
    ports = parse_ports(argv[1])
    agent = Agent(argv[0], ports)
    print(len(ports), flush=True)
    # Ready: from now on it holds none of the streams of whoever started it (as the bridge),
    # nor its session's signals.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    with contextlib.suppress(OSError):
        os.setsid()
    agent.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
