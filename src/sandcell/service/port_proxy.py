"""One HTTP request carried to a server inside a session's sandbox, and its response streamed
back: what ``/v1/sessions/{id}/ports/...`` (``api_ports.py``) and the E2B API's port hosts
(``e2b/port_hosts.py``) both answer with.

The request goes to ``127.0.0.1:PORT`` inside the sandbox through the session's ingress gate
(:meth:`Session.connect_port <sandcell.sessions.ports.PortAccess.connect_port>`), one
connection per request, recorded with ``by``. What authenticated the caller never reaches the
sandbox: ``Authorization``, ``X-API-KEY``, the E2B access-token headers and the hop-by-hop
headers are dropped; ``Host`` becomes ``127.0.0.1:PORT``. Refusals are
:class:`~sandcell.service.problems.ServiceProblem`: the port not the profile's 403, nothing
listening 502, the agent not answering 503, the session gone 404, an upgrade 501 (not served).
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator, Mapping

from starlette.responses import Response, StreamingResponse

from sandcell.errors import SandcellError
from sandcell.network.ingress import IngressUnavailable, PortClosed, PortNotAllowed
from sandcell.service.core import Service
from sandcell.service.problems import ServiceProblem
from sandcell.sessions import Session, SessionEnded

__all__ = ["HOP_BY_HOP", "RESPONSE_TIMEOUT_S", "proxy"]

RESPONSE_TIMEOUT_S = 300.0
"""How long the program's server may take to answer, and between two reads of its body."""
_CHUNK = 64 * 1024
SETTLE_S = 5.0
"""How long, after the response, the connection may take to end (its record is written as it
ends): the server was asked to close it (``Connection: close``)."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {
    "host",
    "authorization",
    "x-api-key",
    "x-access-token",
    "e2b-traffic-access-token",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "content-length",
}


def _listed(value: str | None) -> set[str]:
    """The header names a ``Connection`` header lists (hop-by-hop too)."""
    return {v.strip().lower() for v in (value or "").split(",") if v.strip()}


def request_headers(headers: Mapping[str, str], port: int) -> dict[str, str]:
    """What of the caller's headers the sandbox's server gets (see the module)."""
    listed = _listed(headers.get("connection"))
    out = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED | listed}
    out["Host"] = f"127.0.0.1:{port}"
    out["Connection"] = "close"
    return out


def _response_headers(response: http.client.HTTPResponse) -> dict[str, str]:
    listed = _listed(response.getheader("connection"))
    return {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP | listed}


def _exchange(
    session: Session,
    port: int,
    *,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes,
    by: str | None,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, socket.socket]:
    """Send the request to the sandbox's port and read the response's head (in a thread);
    with the stream's own copy, for :func:`_settle`."""
    sock = session.connect_port(port, by=by)
    drain = sock.dup()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=RESPONSE_TIMEOUT_S)
    sock.settimeout(RESPONSE_TIMEOUT_S)
    conn.sock = sock
    try:
        conn.request(method, target, body=body or None, headers=headers)
        return conn, conn.getresponse(), drain
    except BaseException:
        conn.close()
        drain.close()
        raise


def _settle(conn: http.client.HTTPConnection, drain: socket.socket) -> None:
    """Close the connection and wait (at most :data:`SETTLE_S`) for its end of stream, which
    the ingress gate sends once it recorded the connection: whatever the caller does after
    this answer (a cell) finds the connection in the record."""
    conn.close()
    try:
        drain.shutdown(socket.SHUT_WR)
        drain.settimeout(SETTLE_S)
        while drain.recv(_CHUNK):
            pass
    except OSError:
        pass  # reset, or a server that keeps it open: recorded once it ends
    finally:
        drain.close()


def _body(
    conn: http.client.HTTPConnection, response: http.client.HTTPResponse, drain: socket.socket
) -> Iterator[bytes]:
    """The response's body as it comes (Starlette iterates it on a worker thread)."""
    try:
        while chunk := response.read1(_CHUNK):
            yield chunk
    except OSError:
        return  # the server or the sandbox went away mid-body: the client sees it end
    finally:
        _settle(conn, drain)


async def proxy(
    service: Service,
    session: Session,
    port: int,
    *,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    by: str | None,
) -> Response:
    """The sandbox server's response to ``method target`` on ``port`` (see the module).

    Raises:
        ServiceProblem: the refusals the module lists.
    """
    if port not in session.ingress_ports:
        allowed = ", ".join(map(str, session.ingress_ports)) or "none"
        raise ServiceProblem(
            403,
            f"port {port} is not in the [ingress] ports of profile {session.profile.name!r} "
            f"({allowed})",
        )
    if "upgrade" in _listed(headers.get("connection")):
        raise ServiceProblem(
            501,
            "WebSocket and other upgrades are not served to a session's ports over HTTP; use "
            "sandcell session port (a local forward) for them",
        )
    sent = request_headers(headers, port)
    try:
        conn, response, drain = await service.in_thread(
            lambda: _exchange(
                session, port, method=method, target=target, headers=sent, body=body, by=by
            )
        )
    except PortNotAllowed as exc:
        raise ServiceProblem(403, str(exc)) from None
    except PortClosed as exc:
        raise ServiceProblem(502, str(exc)) from None
    except SessionEnded as exc:
        raise ServiceProblem(404, str(exc)) from None
    except IngressUnavailable as exc:
        raise ServiceProblem(503, str(exc)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ServiceProblem(
            502, f"the server on port {port} in the sandbox did not answer HTTP: {exc}"
        ) from None
    except SandcellError as exc:
        raise ServiceProblem(502, str(exc)) from None
    if method == "HEAD":
        await service.in_thread(lambda: _settle(conn, drain))
        return Response(status_code=response.status, headers=_response_headers(response))
    return StreamingResponse(
        _body(conn, response, drain),
        status_code=response.status,
        headers=_response_headers(response),
    )
