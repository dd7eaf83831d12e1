"""What every endpoint depends on: the service, and the tenant the request's key belongs to.

Two kinds of key: a tenant's API key (it submits: runs, sessions, records) and a tenant's
approver keys (they decide held runs and tool calls, nothing else). :data:`CurrentTenant` takes
only the first; :data:`CurrentPrincipal`, what the approval endpoints take, either. The key is
checked by :class:`sandcell.service.authenticate.AuthenticateFirst` before the request's body is
read; the principal it found is passed on in the request's scope.
"""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from sandcell.service.core import Service
from sandcell.service.local_owner import PEER_UID, builtin_local_tenant
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Principal, Tenant, TenantError

__all__ = [
    "CurrentPrincipal",
    "CurrentTenant",
    "ServiceDep",
    "get_principal",
    "get_service",
    "get_tenant",
]

PRINCIPAL = "sandcell_principal"
"""Where in the request's scope state the principal found before the body was read is kept."""
_bearer = HTTPBearer(auto_error=False, description="a tenant's API key (`sandcell tenants add`)")


async def get_service(request: Request) -> Service:
    # async, as every dependency here: FastAPI runs a plain function in its thread pool, two
    # hand-offs between threads per dependency, each waiting for a time slice on a busy host.
    return _service(request)


def _service(request: Request) -> Service:
    service = request.app.state.service
    assert isinstance(service, Service)
    return service


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sandcell"'}


def principal_of(service: Service, scope: Scope) -> Principal:
    """Whose key the request carries (or the local owner's keyless request), or 401. Called
    once per request, before its body is read (:mod:`sandcell.service.authenticate`)."""
    credentials = _bearer_key(scope)
    if credentials is None:
        uid = scope.get("state", {}).get(PEER_UID)
        if isinstance(uid, int):
            tenant = _local_owner(service, uid, CHALLENGE)
            # The service's own user: the person at the host, who approves with `sandcell
            # approve` anyway, so it both submits and approves.
            return Principal(tenant=tenant, role="owner", key_sha256=tenant.key_sha256)
        raise ServiceProblem(
            401, "send a tenant's API key as 'Authorization: Bearer KEY'", headers=CHALLENGE
        )
    principal = service.tenants.authenticate_principal(credentials)
    if principal is None:
        raise ServiceProblem(401, "unknown or revoked API key", headers=CHALLENGE)
    return principal


def _bearer_key(scope: Scope) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise ServiceProblem(
                    401, "send a tenant's API key as 'Authorization: Bearer KEY'", headers=CHALLENGE
                )
            return key.strip()
    return None


async def get_principal(
    request: Request,
    # Declared for the OpenAPI document (the security scheme); the key is read from the scope.
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller: a tenant's submitter or one of its approvers, or 401."""
    found = request.scope.get("state", {}).get(PRINCIPAL)
    if isinstance(found, Principal):
        return found
    return principal_of(_service(request), request.scope)


async def get_tenant(principal: Annotated[Principal, Depends(get_principal)]) -> Tenant:
    """The caller's tenant, or 401: every /v1 request carries ``Authorization: Bearer KEY``
    (the tenant's API key), except one from the service's own user over the Unix socket (the
    local owner)."""
    if principal.role == "approver":
        raise ServiceProblem(
            403,
            f"this is an approver key of tenant {principal.tenant.name!r}: it lists, shows, "
            "approves and denies approvals (/v1/approvals, /v1/tool-approvals) and nothing "
            "else; send the tenant's API key",
        )
    return principal.tenant


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
CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
