"""A loopback TCP port that forwards each connection to the proxy's Unix socket.

Inside the sandbox's network namespace the only interface is loopback; programs expect a proxy
at ``http://127.0.0.1:PORT``. This forwarder listens there and carries bytes to and from the
proxy socket bound into the sandbox. It decides nothing (the proxy decides everything), so a
program that talks to the socket directly gains nothing.

It imports only the standard library, so it can run under the sandbox's own interpreter::

    python3 bridge.py 127.0.0.1:3128 /run/sandcell/egress.sock
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

_CHUNK = 64 * 1024


class Bridge:
    """Accepts on ``listen`` (host, port; port 0 picks one) and forwards to ``target``."""

    def __init__(self, listen: tuple[str, int], target: str) -> None:
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(listen)
        self._listener.listen(128)
        self._target = target
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.port: int = self._listener.getsockname()[1]
        """The port listened on."""

    def start(self) -> Bridge:
        """Accept connections on a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve, name="sandcell-bridge", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Accept and forward until :meth:`close`."""
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def close(self) -> None:
        """Stop accepting; forwarded connections end when either side closes."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._thread is not None:
            self._thread.join(5)

    def _forward(self, client: socket.socket) -> None:
        # Small writes in both directions (heads, TLS records): no Nagle delay on top.
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self._target)
        except OSError:
            upstream.close()
            client.close()
            return
        back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
        back.start()
        _copy(client, upstream)
        back.join()
        client.close()
        upstream.close()


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


def main(argv: list[str]) -> int:
    """``bridge.py HOST:PORT SOCKET``: print the port listened on, then forward until killed
    (port 0 picks a free one)."""
    if len(argv) != 2 or ":" not in argv[0] or not argv[0].rpartition(":")[2].isdigit():
        print("usage: bridge.py HOST:PORT SOCKET", file=sys.stderr)
        return 2
    host, _, port = argv[0].rpartition(":")
    bridge = Bridge((host.strip("[]"), int(port)), argv[1])
    print(bridge.port, flush=True)
    # Ready: from now on it holds none of the streams of whoever started it (a program's output
    # pipe held open by the bridge would never reach its end), nor its session's signals.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    with contextlib.suppress(OSError):
        os.setsid()
    bridge.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
