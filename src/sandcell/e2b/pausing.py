"""``Sandbox.pause`` (``POST /sandboxes/{id}/pause``) and the resume that ``Sandbox.connect``
does on a paused sandbox.

A pause is the session's (:meth:`Session.pause <sandcell.sessions.Session.pause>`): its state is
saved under the home with the sandbox's labels, its sandbox ends, and it holds no slot of the
tenant's ``max_concurrent`` until a connect brings it back under the same id (and token, while
the tenant's key is the same).
"""

from __future__ import annotations

import asyncio
import hmac

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.backends.cell.state import PauseMode
from sandcell.e2b.errors import E2BError
from sandcell.e2b.opening import Opening, adopt
from sandcell.e2b.paused import PausedSandbox, paused_of
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry
from sandcell.e2b.tenancy import caller
from sandcell.e2b.wire import DEFAULT_TIMEOUT_S, ConnectBody, PauseBody, parse
from sandcell.service.core import Service
from sandcell.service.saved_sessions import check_profile, open_sessions
from sandcell.service.tenants import Tenant

__all__ = ["after_pause", "by", "chosen_mode", "pause_routes", "resume"]


def by(tenant: Tenant) -> str:
    """Who asked, for the session events of the audit chain."""
    return f"e2b: tenant {tenant.name}"


def chosen_mode(offered: frozenset[PauseMode], memory: bool | None) -> PauseMode:
    """The mode of a pause or snapshot: E2B's ``memory`` flag (``mode="full"``: True,
    ``"filesystem"``: False), or, unset, memory where the rung keeps it and files elsewhere."""
    if memory is False:
        return PauseMode.FILES
    if PauseMode.MEMORY in offered:
        return PauseMode.MEMORY
    if memory is None:
        return PauseMode.FILES
    raise E2BError(
        400,
        "this sandbox's rung keeps only its files when it pauses (namespaces: the interpreter's "
        "memory is not saved); pass mode='filesystem', or leave the mode out",
    )


async def after_pause(service: Service, registry: SandboxRegistry, sandbox_id: str) -> None:
    """Wait for a pause of ``sandbox_id`` under way (its timeout's) to be over: a call right
    after the timeout then finds the sandbox paused, not gone."""
    if registry.pausing(sandbox_id):
        await service.in_thread(lambda: registry.wait_paused(sandbox_id), session=True)


async def pause(request: Request) -> Response:
    """204 once paused; 409 when it already is (the SDK's ``pause`` then returns False)."""
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = parse(PauseBody, await request.body())
    await after_pause(service, registry, sandbox_id)
    box = registry.find(tenant.id, sandbox_id)
    if box is None:
        if paused_of(service, tenant.id, sandbox_id) is not None:
            raise E2BError(409, f"sandbox {sandbox_id!r} is already paused")
        raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
    mode = chosen_mode(box.session.pause_modes, body.memory)
    await service.in_thread(lambda: registry.pause(box, mode, by=by(tenant)), session=True)
    return Response(status_code=204)


_resuming: dict[str, asyncio.Event] = {}
"""Sandboxes being resumed (all in the service's event loop): a second connect meanwhile waits
for the first, then finds the sandbox running."""


async def resume(
    service: Service,
    registry: SandboxRegistry,
    tenant: Tenant,
    sandbox_id: str,
    body: ConnectBody,
) -> E2BSandbox | None:
    """The tenant's sandbox ``sandbox_id`` running again if it was paused; None if it was not
    (the caller then looks for a running one)."""
    under_way = _resuming.get(sandbox_id)
    if under_way is not None:
        await under_way.wait()
        return None
    paused = paused_of(service, tenant.id, sandbox_id)
    if paused is None:
        return None
    done = _resuming[sandbox_id] = asyncio.Event()
    try:
        return await _resume(service, registry, tenant, paused, body)
    finally:
        del _resuming[sandbox_id]
        done.set()


async def _resume(
    service: Service,
    registry: SandboxRegistry,
    tenant: Tenant,
    paused: PausedSandbox,
    body: ConnectBody,
) -> E2BSandbox:
    if body.memory is False and paused.mode is PauseMode.MEMORY:
        raise E2BError(
            400,
            "on_resume='reboot' is not served: a sandbox paused with its memory comes back with "
            "it (connect without on_resume)",
        )
    check_profile(tenant, paused.stored)
    labels = paused.labels
    (session,) = await open_sessions(
        service,
        tenant,
        lambda: [service.executor.resume(paused.id, owner=tenant.id, by=by(tenant))],
    )
    # The token came with a key: after the tenant's key changed, the sandbox gets a new one.
    same_key = hmac.compare_digest(labels.key_sha256, tenant.key_sha256)
    opening = Opening(
        template=labels.template,
        metadata=labels.metadata,
        env=labels.env,
        timeout_s=body.timeout or DEFAULT_TIMEOUT_S,
        auto_pause=labels.auto_pause,
        token=labels.token if same_key else None,
        started_at=labels.started_at,
        remembered=labels,
    )
    return await adopt(service, registry, tenant, session, opening, pause_on_failure=paused.mode)


def pause_routes() -> list[Route]:
    return [Route("/sandboxes/{sandbox_id}/pause", pause, methods=["POST"])]
