"""``/v1/sessions/{id}/ports/{port}/{path}``: HTTP to a server the session's program started
inside its sandbox, on a port the session's profile lists (``[ingress] ports``).

The service is the only way in: the request is the tenant's (its key, checked as for every
``/v1`` call; another tenant's session is 404), the port must be the profile's (else 403 with
the reason), and the request goes to ``127.0.0.1:PORT`` inside the sandbox through the
session's ingress gate (:meth:`Session.connect_port
<sandcell.sessions.ports.PortAccess.connect_port>`), one connection per request, recorded with
the tenant's id as ``by``. The tenant's key never reaches the sandbox: ``Authorization`` and
``X-API-KEY`` are dropped, with the hop-by-hop headers; ``Host`` becomes ``127.0.0.1:PORT``.
Nothing listening is 502; the agent not answering 503.

Not served: WebSocket (no WebSocket route takes ``/ports``, so the handshake is refused) and
other upgrades (501); use the Python API's ``forward_port`` or ``sandcell session port`` for
those.
"""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from sandcell.errors import SandcellError
from sandcell.network.ingress import IngressUnavailable, PortClosed, PortNotAllowed
from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.core import Service
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session, SessionEnded

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
RESPONSE_TIMEOUT_S = 300.0
"""How long the program's server may take to answer, and between two reads of its body."""
_CHUNK = 64 * 1024
_HOP_BY_HOP = frozenset(
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
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "x-api-key", "content-length"}


def _session(service: Service, tenant: Tenant, session_id: str) -> Session:
    service.reap_sessions()
    return service.session_for(tenant, session_id).session


def _request_headers(request: Request, port: int) -> dict[str, str]:
    listed = {
        v.strip().lower() for v in request.headers.get("connection", "").split(",") if v.strip()
    }
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in _NOT_FORWARDED and k.lower() not in listed
    }
    headers["Host"] = f"127.0.0.1:{port}"
    headers["Connection"] = "close"
    return headers


def _response_headers(response: http.client.HTTPResponse) -> dict[str, str]:
    listed = {
        v.strip().lower() for v in (response.getheader("connection") or "").split(",") if v.strip()
    }
    return {
        k: v
        for k, v in response.getheaders()
        if k.lower() not in _HOP_BY_HOP and k.lower() not in listed
    }


def _exchange(
    session: Session,
    port: int,
    *,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes,
    by: str,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send the request to the sandbox's port and read the response's head (in a thread)."""
    sock = session.connect_port(port, by=by)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=RESPONSE_TIMEOUT_S)
    sock.settimeout(RESPONSE_TIMEOUT_S)
    conn.sock = sock
    try:
        conn.request(method, target, body=body or None, headers=headers)
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def _body(conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The response's body as it comes (Starlette iterates it on a worker thread)."""
    try:
        while chunk := response.read1(_CHUNK):
            yield chunk
    except OSError:
        return  # the server or the sandbox went away mid-body: the client sees it end
    finally:
        conn.close()


@router.api_route(
    "/{session_id}/ports/{port}/{path:path}",
    methods=METHODS,
    responses=_PROBLEMS,
    response_class=Response,
)
async def port_proxy(
    session_id: str,
    port: int,
    path: str,
    *,
    request: Request,
    service: ServiceDep,
    tenant: CurrentTenant,
) -> Response:
    """Send this request to ``127.0.0.1:PORT/PATH`` (with its query) inside the session's
    sandbox and answer with the server's response, streamed. 403: the profile does not list
    the port; 502: nothing listens on it; 501: a WebSocket upgrade (not served)."""
    session = _session(service, tenant, session_id)
    if port not in session.ingress_ports:
        allowed = ", ".join(map(str, session.ingress_ports)) or "none"
        raise ServiceProblem(
            403,
            f"port {port} is not in the [ingress] ports of profile {session.profile.name!r} "
            f"({allowed})",
        )
    if "upgrade" in request.headers.get("connection", "").lower():
        raise ServiceProblem(
            501,
            "WebSocket and other upgrades are not served through /ports; use sandcell session "
            "port (a local forward) for them",
        )
    target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
    body = await request.body()
    headers = _request_headers(request, port)
    try:
        conn, response = await service.in_thread(
            lambda: _exchange(
                session,
                port,
                method=request.method,
                target=target,
                headers=headers,
                body=body,
                by=tenant.id,
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
    if request.method == "HEAD":
        with contextlib.suppress(OSError):
            conn.close()
        return Response(status_code=response.status, headers=_response_headers(response))
    return StreamingResponse(
        _body(conn, response),
        status_code=response.status,
        headers=_response_headers(response),
    )
