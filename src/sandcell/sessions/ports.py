"""A session's ports: servers the program starts inside the sandbox, reached from outside only
through sandcell, only where the profile lists them (``[ingress] ports``).

>>> with Executor() as ex, ex.session(profile="web.toml") as s:       # doctest: +SKIP
...     s.spawn("python -m http.server 8000")
...     sock = s.connect_port(8000)                 # a stream to 127.0.0.1:8000 inside
...     host, port = s.forward_port(8000)           # or a local port on the host's loopback

The sandbox still has no network. An ingress agent inside it (started next to the egress
bridge, before the program) keeps a control connection to the session's ``ingress.sock``; the
host asks it for each connection (:mod:`sandcell.network.ingress`). Every connection, allowed or
refused, is recorded: in the next cell's run record (``ingress``, beside ``network``), and what
no cell took by the time the session ends (or pauses) in one ``session_ingress`` entry of the
audit chain. A connection does not count as activity: the idle timeout still counts from the
last cell.

Limitation: a session with ports has sockets, and a rung keeps only its files across a pause
(as for egress): memory mode is refused for it.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sandcell.network.ingress import (
    IngressGate,
    IngressRecord,
    IngressUnavailable,
    PortClosed,
    PortNotAllowed,
)
from sandcell.network.port_forward import PortForward

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.policy.profiles import Profile
    from sandcell.run_sockets import RunSockets

_FORWARDS_LOCK = threading.Lock()


class PortAccess:
    """The ports half of :class:`~sandcell.sessions.session.Session` (see the module)."""

    id: str
    executor: Executor
    profile: Profile
    owner: str | None
    _sockets: RunSockets | None
    _ended: str | None

    def _check_alive(self) -> None: ...

    @property
    def ingress_ports(self) -> tuple[int, ...]:
        """The ports of the sandbox reachable through :meth:`connect_port` (the profile's)."""
        gate = self._sockets.ingress if self._sockets is not None else None
        return gate.ports if gate is not None else ()

    def connect_port(self, port: int, *, by: str | None = None) -> socket.socket:
        """A connected stream to 127.0.0.1:``port`` inside the session's sandbox; the caller
        closes it. ``by`` names who asked, for the record.

        Raises:
            PortNotAllowed: the profile does not list ``port`` (ConfigError).
            PortClosed: nothing listens on it in the sandbox (ConfigError).
            IngressUnavailable: the sandbox's agent is not connected (InfraError).
            SessionEnded: the session has ended.
        """
        self._check_alive()
        return self._gate(port).connect(port, by=by)

    def forward_port(
        self, port: int, host_port: int = 0, *, by: str | None = None
    ) -> tuple[str, int]:
        """Listen on 127.0.0.1:``host_port`` of the host (0: a free one) and carry each
        connection to ``port`` in the sandbox, until the session ends or
        :meth:`stop_forward`; returns the (host, port) it listens on."""
        self._check_alive()
        forward = PortForward(self._gate(port), port, host_port=host_port, by=by)
        with _FORWARDS_LOCK:
            self._forwards().append(forward)
        if self._ended is not None:
            forward.close()
            self._check_alive()
        return forward.address

    def stop_forward(self, address: tuple[str, int]) -> bool:
        """Stop the forward listening on ``address``; False when there is none."""
        with _FORWARDS_LOCK:
            forwards = self._forwards()
            found = [f for f in forwards if f.address == tuple(address)]
            for forward in found:
                forwards.remove(forward)
        for forward in found:
            forward.close()
        return bool(found)

    def _gate(self, port: int) -> IngressGate:
        gate = self._sockets.ingress if self._sockets is not None else None
        if gate is None:
            raise PortNotAllowed(
                f"profile {self.profile.name!r} lists no ingress ports, so port {port} of the "
                "session cannot be reached; add [ingress] ports = [...] to a profile of yours"
            )
        return gate

    def _forwards(self) -> list[PortForward]:
        forwards: list[PortForward] | None = self.__dict__.get("_port_forwards")
        if forwards is None:
            forwards = self.__dict__["_port_forwards"] = []
        return forwards

    def _close_ports(self) -> None:
        """Stop every forward (the gate itself stops with the session's sockets)."""
        with _FORWARDS_LOCK:
            forwards, self.__dict__["_port_forwards"] = self._forwards(), []
        for forward in forwards:
            forward.close()

    def _record_leftover_ingress(self, outside: Mapping[str, object], backend: str) -> None:
        """What no cell's record took of the session's port connections, as one audit entry."""
        ingress = outside.get("ingress")
        if not isinstance(ingress, dict) or not ingress.get("connections"):
            return
        from sandcell.sessions import saving

        now = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
        entry = self.executor.audit.append(
            {
                "run_id": uuid.uuid4().hex,
                "kind": "session_ingress",
                "language": "session",
                "code": "",
                "outcome": "ok",
                "reason": "connections to the session's ports after its last cell",
                "session_id": self.id,
                "profile": self.profile.name,
                "backend": {"name": backend},
                "ingress": ingress,
                "started_at": now,
                "finished_at": now,
                "usage": {"wall_ms": 0.0, "cpu_ms": None, "peak_memory_bytes": None},
                "record_version": 1,
            }
        )
        saving.tell_listeners(self.executor, self.owner, entry)


__all__ = [
    "IngressRecord",
    "IngressUnavailable",
    "PortAccess",
    "PortClosed",
    "PortNotAllowed",
]
