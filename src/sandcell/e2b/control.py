"""E2B's control plane: create, connect, list, get, set the timeout of and kill sandboxes.

Authenticated by the tenant's key in ``X-API-KEY``. A sandbox is a session on the tenant's
profile: ``templateID`` names one of the tenant's profiles, one of the tenant's snapshots
(:mod:`.snapshots`: the sandbox starts from it), or is an E2B template name (``base``,
``code-interpreter-v1``...) for the tenant's default profile. A paused sandbox
(:mod:`.pausing`) is listed, described, resumed by ``connect`` and deleted by ``kill``.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError
from sandcell.e2b.labels import AutoPause
from sandcell.e2b.listing import ListQuery
from sandcell.e2b.opening import Opening, adopt
from sandcell.e2b.paused import PausedSandbox, paused_detail_json, paused_of, paused_of_tenant
from sandcell.e2b.pausing import after_pause, resume
from sandcell.e2b.registry import E2BSandbox
from sandcell.e2b.snapshots import snapshot_of, start_from_snapshot
from sandcell.e2b.tenancy import caller
from sandcell.e2b.wire import (
    ConnectBody,
    NewSandbox,
    RefreshBody,
    TimeoutBody,
    detail_json,
    parse,
    sandbox_json,
)
from sandcell.service.saved_sessions import open_sessions

__all__ = ["control_routes"]

_SESSION_LIFE_S = 86_400.0


def _auto_pause(body: NewSandbox) -> AutoPause:
    """What the sandbox's timeout does, from ``lifecycle`` at create."""
    if body.auto_resume is not None and body.auto_resume.enabled:
        raise E2BError(
            400,
            "lifecycle auto_resume is not served: traffic to a paused sandbox does not resume "
            "it; resume it with Sandbox.connect (leave auto_resume out)",
        )
    if not body.auto_pause:
        return "off"
    if body.auto_pause_memory is None:
        return "best"
    return "memory" if body.auto_pause_memory else "files"


async def create(request: Request) -> Response:
    service, registry, tenant = caller(request)
    body = parse(NewSandbox, await request.body())
    auto_pause = _auto_pause(body)
    if body.template_id not in tenant.profiles:
        snapshot = snapshot_of(service, tenant, body.template_id)
        if snapshot is not None:
            box = await start_from_snapshot(
                service, registry, tenant, body, snapshot, auto_pause=auto_pause
            )
            return JSONResponse(sandbox_json(box), status_code=201)
    profile_name = body.template_id if body.template_id in tenant.profiles else None
    profile = service.profile_for(tenant, profile_name)
    (session,) = await open_sessions(
        service,
        tenant,
        lambda: [
            service.executor.session(
                profile=profile,
                idle_timeout_s=_SESSION_LIFE_S,
                max_lifetime_s=_SESSION_LIFE_S,
                # The E2B timeout is the registry's; this covers the day's lifetime, should it
                # come first.
                on_idle="end" if auto_pause == "off" else "pause",
                owner=tenant.id,
            )
        ],
    )
    opening = Opening(
        template=body.template_id,
        metadata=dict(body.metadata or {}),
        env=dict(body.env_vars or {}),
        timeout_s=body.timeout,
        auto_pause=auto_pause,
    )
    box = await adopt(service, registry, tenant, session, opening)
    return JSONResponse(sandbox_json(box), status_code=201)


async def connect(request: Request) -> Response:
    """The sandbox, running: resumed (201) when it was paused, as it is (200) otherwise."""
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = parse(ConnectBody, await request.body())
    # A pause under way (its timeout's) finishes first, and the connect resumes it.
    await after_pause(service, registry, sandbox_id)
    if registry.find(tenant.id, sandbox_id) is None:
        resumed = await resume(service, registry, tenant, sandbox_id, body)
        if resumed is not None:
            return JSONResponse(sandbox_json(resumed), status_code=201)
    box = registry.owned(tenant.id, sandbox_id)
    if body.timeout is not None:
        registry.set_timeout(box, body.timeout)
    return JSONResponse(sandbox_json(box), status_code=200)


async def get_info(request: Request) -> Response:
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    box = registry.find(tenant.id, sandbox_id)
    if box is not None:
        return JSONResponse(detail_json(box))
    paused = paused_of(service, tenant.id, sandbox_id)
    if paused is None:
        raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
    return JSONResponse(paused_detail_json(paused))


async def set_timeout(request: Request) -> Response:
    _, registry, tenant = caller(request)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    registry.set_timeout(box, parse(TimeoutBody, await request.body()).timeout)
    return Response(status_code=204)


async def refresh(request: Request) -> Response:
    """Keep the sandbox alive ``duration`` seconds more from now (never shortens it)."""
    _, registry, tenant = caller(request)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    duration = parse(RefreshBody, await request.body()).duration
    if box.deadline < time.monotonic() + duration:
        registry.set_timeout(box, duration)
    return Response(status_code=204)


async def kill(request: Request) -> Response:
    """End a running sandbox, or delete a paused one's state (404: neither, so the SDK's
    ``kill`` returns False)."""
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    await after_pause(service, registry, sandbox_id)
    box = registry.find(tenant.id, sandbox_id)
    if box is not None:
        await service.in_thread(lambda: registry.kill(box, "killed by its client"), session=True)
        return Response(status_code=204)
    if paused_of(service, tenant.id, sandbox_id) is None:
        raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
    await service.in_thread(
        lambda: service.executor.delete_paused(sandbox_id, owner=tenant.id), session=True
    )
    return Response(status_code=204)


async def list_sandboxes(request: Request) -> Response:
    """The tenant's sandboxes, running and paused, that the query names, in its order, a page
    of ``limit`` at a time (the next page's token, a cursor, in ``x-next-token``)."""
    service, registry, tenant = caller(request)
    query = ListQuery.of(request.query_params)
    listed: list[E2BSandbox | PausedSandbox] = [
        b for b in registry.of_tenant(tenant.id) if query.matches(b)
    ]
    if "paused" in query.states:
        found = await service.in_thread(lambda: paused_of_tenant(service, tenant.id))
        listed += [p for p in found if query.matches(p)]
    page, next_token = query.page(listed)
    headers = {"x-next-token": next_token} if next_token is not None else {}
    shown = [detail_json(b) if isinstance(b, E2BSandbox) else paused_detail_json(b) for b in page]
    return JSONResponse(shown, headers=headers)


def control_routes() -> list[Route]:
    one = "/sandboxes/{sandbox_id}"
    return [
        Route("/v2/sandboxes", create, methods=["POST"]),
        Route("/sandboxes", create, methods=["POST"]),
        Route("/v2/sandboxes", list_sandboxes, methods=["GET"]),
        Route("/sandboxes", list_sandboxes, methods=["GET"]),
        Route(f"/v2{one}/connect", connect, methods=["POST"]),
        Route(f"{one}/connect", connect, methods=["POST"]),
        Route(f"{one}/resume", connect, methods=["POST"]),
        Route(f"{one}/timeout", set_timeout, methods=["POST"]),
        Route(f"{one}/refreshes", refresh, methods=["POST"]),
        Route(one, get_info, methods=["GET"]),
        Route(one, kill, methods=["DELETE"]),
    ]
