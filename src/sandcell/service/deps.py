"""What every endpoint depends on: the service, and the tenant the request's key belongs to."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandcell.service.core import Service
from sandcell.service.local_owner import PEER_UID, builtin_local_tenant
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant, TenantError

__all__ = ["CurrentTenant", "ServiceDep", "get_service", "get_tenant"]

_bearer = HTTPBearer(auto_error=False, description="a tenant's API key (`sandcell tenants add`)")


async def get_service(request: Request) -> Service:
    # async, as every dependency here: FastAPI runs a plain function in its thread pool, two
    # hand-offs between threads per dependency, each waiting for a time slice on a busy host.
    return _service(request)


def _service(request: Request) -> Service:
    service = request.app.state.service
    assert isinstance(service, Service)
    return service


async def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The caller's tenant, or 401: every /v1 request carries ``Authorization: Bearer KEY``,
    except one from the service's own user over the Unix socket (the local owner)."""
    challenge = {"WWW-Authenticate": 'Bearer realm="sandcell"'}
    if credentials is None:
        uid = request.scope.get("state", {}).get(PEER_UID)
        if isinstance(uid, int):
            return _local_owner(_service(request), uid, challenge)
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise ServiceProblem(
            401, "send a tenant's API key as 'Authorization: Bearer KEY'", headers=challenge
        )
    tenant = _service(request).tenants.authenticate(credentials.credentials)
    if tenant is None:
        raise ServiceProblem(401, "unknown or revoked API key", headers=challenge)
    return tenant


def _local_owner(service: Service, uid: int, challenge: dict[str, str]) -> Tenant:
    owner = os.geteuid()
    if uid != owner:
        raise ServiceProblem(
            401,
            f"this socket serves its owner (uid {owner}) without a key; uid {uid} must send a "
            "tenant's API key as 'Authorization: Bearer KEY'",
            headers=challenge,
        )
    name = service.config.local_tenant
    if name is None:
        return builtin_local_tenant()
    try:
        return service.tenants.get(name)
    except TenantError:
        raise ServiceProblem(
            401,
            f"the local tenant {name!r} (sandcell serve --local-tenant) no longer exists; "
            "send a tenant's API key",
            headers=challenge,
        ) from None


ServiceDep = Annotated[Service, Depends(get_service)]
CurrentTenant = Annotated[Tenant, Depends(get_tenant)]
