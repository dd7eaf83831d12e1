"""E2B's control plane: create, connect, list, get, set the timeout of and kill sandboxes.

Authenticated by the tenant's key in ``X-API-KEY``. A sandbox is a session on the tenant's
profile: ``templateID`` names one of the tenant's profiles, or is an E2B template name
(``base``, ``code-interpreter-v1``...) for the tenant's default profile.
"""

from __future__ import annotations

import datetime as dt
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError
from sandcell.e2b.fs_cells import cell_for, reply_of
from sandcell.e2b.listing import ListQuery
from sandcell.e2b.paths import HOME
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry, new_token
from sandcell.e2b.runner import run_cell
from sandcell.e2b.wire import (
    ConnectBody,
    NewSandbox,
    RefreshBody,
    TimeoutBody,
    detail_json,
    parse,
    sandbox_json,
)
from sandcell.service.core import LiveSession, Service
from sandcell.service.tenants import Tenant

__all__ = ["control_routes"]

_SESSION_LIFE_S = 86_400.0


def _tenant(request: Request, service: Service) -> Tenant:
    key = request.headers.get("x-api-key")
    if not key:
        raise E2BError(401, "send a tenant's API key as X-API-KEY (E2B_API_KEY)")
    tenant = service.tenants.authenticate(key)
    if tenant is None:
        raise E2BError(401, "unknown or revoked API key")
    return tenant


def _ctx(request: Request) -> tuple[Service, SandboxRegistry]:
    return request.app.state.service, request.app.state.registry


async def create(request: Request) -> Response:
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    body = parse(NewSandbox, await request.body())
    profile_name = body.template_id if body.template_id in tenant.profiles else None
    profile = service.profile_for(tenant, profile_name)
    service.admit(tenant, sandbox=True)
    try:
        session = await service.in_thread(
            lambda: service.executor.session(
                profile=profile, idle_timeout_s=_SESSION_LIFE_S, max_lifetime_s=_SESSION_LIFE_S
            ),
            session=True,
        )
    except BaseException:
        service.quotas.release(tenant.id)
        raise
    live = LiveSession(
        tenant=tenant.id,
        session=session,
        inputs_dir=None,
        surface="e2b",
        # The access token handed out below lasts as long as this key: rotating it ends the
        # sandbox (SandboxRegistry).
        key_sha256=tenant.key_sha256,
    )
    service.add_session(live)
    box = E2BSandbox(
        id=session.id,
        tenant=tenant.id,
        template=body.template_id,
        live=live,
        token=new_token(),
        workspace="",
        metadata=dict(body.metadata or {}),
        env=dict(body.env_vars or {}),
        started_at=dt.datetime.now(dt.UTC),
        deadline=time.monotonic() + body.timeout,
    )
    registry.add(box)
    try:
        await _setup(service, tenant, box)
    except BaseException:
        await service.in_thread(lambda: registry.kill(box, "its setup failed"), session=True)
        raise
    return JSONResponse(sandbox_json(box), status_code=201)


async def _setup(service: Service, tenant: Tenant, box: E2BSandbox) -> None:
    """Learn where the workspace is inside the sandbox, and give the kernel the sandbox's
    environment variables (commands get them on their own)."""
    service.admit(tenant, sandbox=False)
    # Every rung shows the workspace at /home/user too (layout.SANDBOX_HOME): E2B code starts
    # there, as it would in an E2B sandbox, and the kernel's directory is the workspace's path
    # from then on.
    # PWD too: the home and /sandbox are one directory, so a shell would trust an inherited
    # PWD=/sandbox and print that.
    code = f"import os as _o\n_o.chdir({HOME!r})\n_o.environ['PWD'] = {HOME!r}\ndel _o\n"
    code += cell_for("pwd", "")
    if box.env:
        code = f"import os as _o\n_o.environ.update({box.env!r})\ndel _o\n" + code
    reply = reply_of(await run_cell(service, tenant, box, code), "/")
    root = reply.get("root")
    if not isinstance(root, str) or not root.startswith("/"):
        raise E2BError(500, "the sandbox did not say where its workspace is")
    box.workspace = root


async def connect(request: Request) -> Response:
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    body = parse(ConnectBody, await request.body())
    if body.timeout is not None:
        registry.set_timeout(box, body.timeout)
    return JSONResponse(sandbox_json(box), status_code=200)


async def get_info(request: Request) -> Response:
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    return JSONResponse(detail_json(registry.owned(tenant.id, request.path_params["sandbox_id"])))


async def set_timeout(request: Request) -> Response:
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    registry.set_timeout(box, parse(TimeoutBody, await request.body()).timeout)
    return Response(status_code=204)


async def refresh(request: Request) -> Response:
    """Keep the sandbox alive ``duration`` seconds more from now (never shortens it)."""
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    duration = parse(RefreshBody, await request.body()).duration
    if box.deadline < time.monotonic() + duration:
        registry.set_timeout(box, duration)
    return Response(status_code=204)


async def kill(request: Request) -> Response:
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    box = registry.owned(tenant.id, request.path_params["sandbox_id"])
    await service.in_thread(lambda: registry.kill(box, "killed by its client"), session=True)
    return Response(status_code=204)


async def list_sandboxes(request: Request) -> Response:
    """The tenant's running sandboxes that the query names, in its order, a page of ``limit``
    at a time (the next page's token, a cursor, in ``x-next-token``)."""
    service, registry = _ctx(request)
    tenant = _tenant(request, service)
    query = ListQuery.of(request.query_params)
    boxes = [b for b in registry.of_tenant(tenant.id) if query.matches(b)]
    page, next_token = query.page(boxes)
    headers = {"x-next-token": next_token} if next_token is not None else {}
    return JSONResponse([detail_json(b) for b in page], headers=headers)


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
