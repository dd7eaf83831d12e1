"""Loopback servers and clients for the egress proxy tests: HTTP, HTTPS with a test CA, raw.

Every server here listens on 127.0.0.0/8 only; names reach them through the proxy's injected
resolver, never through DNS.
"""

from __future__ import annotations

import contextlib
import http.server
import select
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trustme

from sandcell.network.addresses import MapResolver, Resolver
from sandcell.network.allowlist import parse_allowlist
from sandcell.network.bridge import Bridge
from sandcell.network.caps import ProxyLimits
from sandcell.network.proxy import EgressProxy

NAMES = ("api.test", "other.test", "www.wild.test", "127.0.0.1")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.path.endswith("/") else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.seen.append((self.command, self.headers.get("Host", ""), self.path))
        if self.path in self.server.files:
            self._answer(self.server.files[self.path])
        elif self.path.startswith("/big/"):
            self._answer(b"x" * int(self.path.split("/")[2]))
        else:
            self._answer(f"hello {self.headers.get('Host')} {self.path}".encode())

    def do_POST(self) -> None:
        self.server.seen.append((self.command, self.headers.get("Host", ""), self.path))
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.bodies.append(body)
        self._answer(f"got {len(body)} bytes".encode())


class Server(http.server.ThreadingHTTPServer):
    """An HTTP(S) server on loopback that remembers each request (method, Host, path)."""

    daemon_threads = True

    def __init__(self, address: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        if ":" in address:
            self.address_family = socket.AF_INET6
        super().__init__((address, 0), _Handler)
        self.seen: list[tuple[str, str, str]] = []
        self.bodies: list[bytes] = []
        self.files: dict[str, bytes] = {}
        """Path -> content served as it is (a package index, for pip)."""
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.port: int = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request: object, client_address: object) -> None:
        return  # refused tunnels end handshakes early; that is what the tests cause


@dataclass
class Servers:
    ca: trustme.CA
    ca_file: Path
    plain: Server
    tls: Server
    client_tls: ssl.SSLContext = field(init=False)

    def __post_init__(self) -> None:
        self.client_tls = ssl.create_default_context()
        self.ca.configure_trust(self.client_tls)


@contextlib.contextmanager
def servers(folder: Path) -> Iterator[Servers]:
    ca = trustme.CA()
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*NAMES).configure_cert(context)
    plain, tls = Server(), Server(tls=context)
    try:
        yield Servers(ca=ca, ca_file=ca_file, plain=plain, tls=tls)
    finally:
        for server in (plain, tls):
            server.shutdown()
            server.server_close()


class Listener:
    """A bare listening socket that never accepts: :meth:`was_reached` tells whether anything
    connected (a completed connection waits in the backlog, so no waiting is needed)."""

    def __init__(self, address: str, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, port))
        self.sock.listen(8)
        self.port: int = self.sock.getsockname()[1]

    def was_reached(self) -> bool:
        return bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        self.sock.close()


class RawUpstream:
    """A loopback server that keeps the exact bytes each connection sent it.

    Per connection it reads the request head and ``body_bytes`` more, answers ``200 ok`` and
    closes; :meth:`received` waits for a connection to have ended and gives its bytes.
    """

    def __init__(self, body_bytes: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port: int = self.sock.getsockname()[1]
        self._body_bytes = body_bytes
        self.accepted = 0
        """Connections accepted (a server that answered has accepted before its answer)."""
        self._done: list[bytes] = []
        self._ended = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            conn.settimeout(10)
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data or len(data) < (
                    data.index(b"\r\n\r\n") + 4 + self._body_bytes
                ):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                conn.shutdown(socket.SHUT_WR)
                while chunk := conn.recv(65536):
                    data += chunk
        with self._ended:
            self._done.append(data)
            self._ended.notify_all()

    def received(self, index: int = 0, timeout_s: float = 10.0) -> bytes:
        """What connection ``index`` sent, once it has ended."""
        with self._ended:
            self._ended.wait_for(lambda: len(self._done) > index, timeout_s)
            return self._done[index]

    def close(self) -> None:
        self.sock.close()


@dataclass
class Running:
    proxy: EgressProxy
    bridge: Bridge

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.bridge.port}"

    @property
    def path(self) -> str:
        return str(self.proxy.socket_path)


@contextlib.contextmanager
def running_proxy(
    hosts: tuple[str, ...],
    *,
    allow_addresses: tuple[str, ...] = ("127.0.0.1",),
    resolver: Resolver | None = None,
    limits: ProxyLimits | None = None,
    profile: str = "fetch-data",
) -> Iterator[Running]:
    """A proxy for ``hosts`` on a fresh socket, with a loopback bridge in front of it."""
    folder = Path(tempfile.mkdtemp(prefix="egress-", dir="/tmp"))
    proxy = EgressProxy(
        profile=profile,
        allowlist=parse_allowlist(hosts, allow_addresses),
        socket_path=folder / "proxy.sock",
        limits=limits,
        resolver=resolver or MapResolver({n: ["127.0.0.1"] for n in NAMES[:3]}),
    )
    proxy.start()
    bridge = Bridge(("127.0.0.1", 0), str(proxy.socket_path)).start()
    try:
        yield Running(proxy=proxy, bridge=bridge)
    finally:
        bridge.close()
        proxy.stop()
        folder.rmdir()


def exchange(path: str, data: bytes, *, timeout_s: float = 10.0, cut_ok: bool = False) -> bytes:
    """Send ``data`` to the proxy socket and read until it closes.

    ``cut_ok``: the proxy may close the connection while ``data`` is still being sent.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if not cut_ok:
                raise
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def open_tunnel(
    path: str, authority: str, *, timeout_s: float = 10.0
) -> tuple[socket.socket, bytes]:
    """A socket on which CONNECT was sent, and the proxy's answer head."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    sock.connect(path)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(1)
        if not chunk:
            break
        answer += chunk
    return sock, answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])
