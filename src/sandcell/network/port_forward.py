"""A local TCP port on the host's loopback that carries each connection to a session's port
through its :class:`~sandcell.network.ingress.IngressGate` (``sandcell session port``, or a
browser pointed at a notebook in the sandbox).

It listens on 127.0.0.1 only, so only programs on this host reach it; each connection it accepts
is one connection of the gate's, recorded there. A refused one (nothing listens in the sandbox)
is closed at once. It decides nothing the gate does not.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from sandcell.errors import ConfigError, SandcellError
from sandcell.network.ingress import IngressGate, PortNotAllowed

LOOPBACK = "127.0.0.1"


class PortForward:
    """Accepts on 127.0.0.1:``host_port`` (0 picks one) and carries to ``port`` in the sandbox."""

    def __init__(
        self, gate: IngressGate, port: int, *, host_port: int = 0, by: str | None = None
    ) -> None:
        if port not in gate.ports:
            allowed = ", ".join(map(str, gate.ports)) or "none"
            raise PortNotAllowed(
                f"port {port} is not in the profile's [ingress] ports ({allowed}); nothing to "
                "forward"
            )
        self._gate = gate
        self.port = port
        self._by = by
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind((LOOPBACK, host_port))
        except OSError as exc:
            listener.close()
            raise ConfigError(
                f"cannot listen on {LOOPBACK}:{host_port}: {exc.strerror or exc}"
            ) from None
        listener.listen(64)
        self._listener = listener
        self.address: tuple[str, int] = (LOOPBACK, listener.getsockname()[1])
        """Where it listens on the host."""
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"sandcell-forward-{port}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._gate.serve(self.port, client, by=self._by)
        except SandcellError:
            # Refused (recorded by the gate): the client sees the connection closed.
            client.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Stop accepting; connections already carried end with the gate. Idempotent."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


__all__ = ["LOOPBACK", "PortForward"]
