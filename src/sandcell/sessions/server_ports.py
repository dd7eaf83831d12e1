"""The session server's requests for a session's ports (:mod:`sandcell.sessions.server`), which
``sandcell session port`` sends. A forward lives in the server, next to its session, until the
session ends (or ``stop_forward``):

* ``{"op": "forward_port", "port": N, "host_port": N, "by": WHO}`` ->
  ``{"ok": true, "address": [HOST, PORT]}``: where it listens (127.0.0.1 only)
* ``{"op": "stop_forward", "address": [HOST, PORT]}`` -> ``{"ok": true, "stopped": BOOL}``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandcell.errors import ConfigError

if TYPE_CHECKING:
    from sandcell.sessions.session import Session

__all__ = ["PORT_OPS", "port_reply"]

PORT_OPS = frozenset({"forward_port", "stop_forward"})


def _port(value: object, name: str, *, zero: bool = False) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 65536:
        raise ConfigError(f"{name} must be a port number ({low}-65535), not {value!r}")
    return value


def port_reply(session: Session, request: dict[str, object]) -> dict[str, Any]:
    """Answer one of :data:`PORT_OPS` (raises ConfigError for a malformed one)."""
    op = request.get("op")
    if op == "forward_port":
        by = request.get("by")
        host, port = session.forward_port(
            _port(request.get("port"), "port"),
            _port(request.get("host_port", 0), "host_port", zero=True),
            by=by if isinstance(by, str) else None,
        )
        return {"ok": True, "address": [host, port]}
    address = request.get("address")
    if not (
        isinstance(address, list)
        and len(address) == 2
        and isinstance(address[0], str)
        and isinstance(address[1], int)
    ):
        raise ConfigError("stop_forward needs the address [HOST, PORT] forward_port answered")
    return {"ok": True, "stopped": session.stop_forward((address[0], address[1]))}
