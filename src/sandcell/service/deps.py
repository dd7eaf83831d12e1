"""What every endpoint depends on: the service, and the tenant the request's key belongs to."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandcell.service.core import Service
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant

__all__ = ["CurrentTenant", "ServiceDep", "get_service", "get_tenant"]

_bearer = HTTPBearer(auto_error=False, description="a tenant's API key (`sandcell tenants add`)")


def get_service(request: Request) -> Service:
    service = request.app.state.service
    assert isinstance(service, Service)
    return service


def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The caller's tenant, or 401: every /v1 request carries ``Authorization: Bearer KEY``."""
    challenge = {"WWW-Authenticate": 'Bearer realm="sandcell"'}
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise ServiceProblem(
            401, "send a tenant's API key as 'Authorization: Bearer KEY'", headers=challenge
        )
    tenant = get_service(request).tenants.authenticate(credentials.credentials)
    if tenant is None:
        raise ServiceProblem(401, "unknown or revoked API key", headers=challenge)
    return tenant


ServiceDep = Annotated[Service, Depends(get_service)]
CurrentTenant = Annotated[Tenant, Depends(get_tenant)]
