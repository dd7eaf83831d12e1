"""Whose call a control-plane request is: the tenant of the key in ``X-API-KEY``.

Every control-plane route starts here; a sandbox or snapshot of another tenant is then "not
found" to it (404), never "forbidden", so one tenant learns nothing of another's ids.
"""

from __future__ import annotations

from starlette.requests import Request

from sandcell.e2b.errors import E2BError
from sandcell.e2b.registry import SandboxRegistry
from sandcell.service.core import Service
from sandcell.service.tenants import Tenant

__all__ = ["caller", "tenant_of_request"]


def tenant_of_request(request: Request, service: Service) -> Tenant:
    key = request.headers.get("x-api-key")
    if not key:
        raise E2BError(401, "send a tenant's API key as X-API-KEY (E2B_API_KEY)")
    tenant = service.tenants.authenticate(key)
    if tenant is None:
        raise E2BError(401, "unknown or revoked API key")
    return tenant


def caller(request: Request) -> tuple[Service, SandboxRegistry, Tenant]:
    """The service, its E2B sandboxes, and the tenant calling (401 without a working key)."""
    service: Service = request.app.state.service
    registry: SandboxRegistry = request.app.state.registry
    return service, registry, tenant_of_request(request, service)
