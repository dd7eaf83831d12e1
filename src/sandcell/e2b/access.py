"""Which sandbox an envd or interpreter call is for: the ``E2b-Sandbox-Id`` header and the
sandbox's access token (``X-Access-Token`` or ``E2B-Traffic-Access-Token``)."""

from __future__ import annotations

from starlette.requests import Request

from sandcell.e2b.errors import E2BError
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry
from sandcell.service.core import Service

__all__ = ["sandbox_of", "service_of"]


def service_of(request: Request) -> Service:
    service = request.app.state.service
    assert isinstance(service, Service)
    return service


def sandbox_of(request: Request) -> E2BSandbox:
    registry = request.app.state.registry
    assert isinstance(registry, SandboxRegistry)
    sandbox_id = request.headers.get("e2b-sandbox-id")
    if not sandbox_id:
        raise E2BError(400, "send the sandbox's id as E2b-Sandbox-Id (E2B_SANDBOX_URL traffic)")
    token = request.headers.get("x-access-token") or request.headers.get("e2b-traffic-access-token")
    return registry.reached(sandbox_id, token)
