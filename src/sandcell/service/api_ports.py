"""``/v1/sessions/{id}/ports/{port}/{path}``: HTTP to a server the session's program started
inside its sandbox, on a port the session's profile lists (``[ingress] ports``).

The service is the only way in: the request is the tenant's (its key, checked as for every
``/v1`` call; another tenant's session is 404), the port must be the profile's (else 403 with
the reason), and the request is carried as :mod:`sandcell.service.port_proxy` says, recorded
with the tenant's id as ``by``; the tenant's key never reaches the sandbox.

Not served: WebSocket (no WebSocket route takes ``/ports``, so the handshake is refused) and
other upgrades (501); use the Python API's ``forward_port`` or ``sandcell session port`` for
those.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.port_proxy import proxy

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


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
    the port; 502: nothing listens on it; 501: an upgrade (not served)."""
    service.reap_sessions()
    session = service.session_for(tenant, session_id).session
    target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
    return await proxy(
        service,
        session,
        port,
        method=request.method,
        target=target,
        headers=request.headers,
        body=await request.body(),
        by=tenant.id,
    )


# One route per method, each with an operation id of its own (one route of many methods would
# give them all the same id in the OpenAPI document).
for _method in METHODS:
    router.add_api_route(
        "/{session_id}/ports/{port}/{path:path}",
        port_proxy,
        methods=[_method],
        responses=_PROBLEMS,
        response_class=Response,
        operation_id=f"port_proxy_{_method.lower()}",
    )
