"""Snapshots: ``create_snapshot`` (``POST /sandboxes/{id}/snapshots``), ``list_snapshots``
(``GET /snapshots``), ``delete_snapshot`` (``DELETE /templates/{id}``) and
``Sandbox.create(snapshot_id)``, which starts a sandbox from one.

A snapshot is a named state of the tenant's (:meth:`Session.snapshot
<sandcell.sessions.Session.snapshot>`): its id, as E2B's SDKs use it (``snapshotID``, the
template to create from), is its name. A sandbox started from it runs under the profile it was
saved under; its own template name is that id, and its metadata and timeout are the create's.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError
from sandcell.e2b.labels import AutoPause, SandboxLabels
from sandcell.e2b.listing import page_limit
from sandcell.e2b.opening import Opening, adopt
from sandcell.e2b.pausing import by, chosen_mode
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry
from sandcell.e2b.tenancy import caller
from sandcell.e2b.wire import NewSandbox, SnapshotBody, parse
from sandcell.errors import ConfigError
from sandcell.service.core import Service
from sandcell.service.saved_sessions import check_profile, check_room, open_sessions
from sandcell.service.tenants import Tenant
from sandcell.sessions.states import StoredState, check_snapshot_name

__all__ = ["snapshot_of", "snapshot_routes", "start_from_snapshot"]


def snapshot_of(service: Service, tenant: Tenant, name: str) -> StoredState | None:
    """The tenant's snapshot named ``name``, or None (none of that name, or not a name)."""
    if name in tenant.profiles:
        return None
    with contextlib.suppress(ConfigError):
        return service.executor.states.find_snapshot(name, owner=tenant.id)
    return None


def _info(state: StoredState) -> dict[str, object]:
    name = state.name or state.id
    return {"snapshotID": name, "names": [name]}


async def create_snapshot(request: Request) -> Response:
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = parse(SnapshotBody, await request.body())
    box = registry.find(tenant.id, sandbox_id)
    if box is None:
        raise E2BError(404, f"sandbox {sandbox_id!r} was not found (a paused one: connect first)")
    name = body.name or f"snapshot-{secrets.token_hex(6)}"
    try:
        check_snapshot_name(name)
    except ConfigError as exc:
        raise E2BError(400, f"name: {exc}") from None
    if name in tenant.profiles:
        # Sandbox.create(template=NAME) names a profile first: a snapshot so named could never
        # be started.
        raise E2BError(
            400, f"name: {name!r} is one of your profiles' names; give the snapshot another"
        )
    mode = chosen_mode(box.session.pause_modes, body.memory)
    await service.in_thread(lambda: check_room(service, tenant, box.session, mode))
    box.remember()
    state = await service.in_thread(
        lambda: box.session.snapshot(name, mode=mode, by=by(tenant)), session=True
    )
    return JSONResponse(_info(state), status_code=201)


def _cursor(state: StoredState) -> str:
    return base64.urlsafe_b64encode(f"{state.created_at}|{state.id}".encode()).decode()


def _after(raw: str) -> tuple[str, str]:
    try:
        created, _, state_id = base64.urlsafe_b64decode(raw.encode()).decode().partition("|")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise E2BError(400, "nextToken: give the x-next-token of the previous page") from None
    if not state_id:
        raise E2BError(400, "nextToken: give the x-next-token of the previous page")
    return created, state_id


async def list_snapshots(request: Request) -> Response:
    """The tenant's snapshots, oldest first (of one sandbox with ``sandboxID``, one name with
    ``name``), a page of ``limit`` at a time; the next page's cursor in ``x-next-token``."""
    service, _, tenant = caller(request)
    params = request.query_params
    limit = page_limit(params)
    source, name = params.get("sandboxID"), params.get("name")
    states = await service.in_thread(lambda: service.executor.snapshots(owner=tenant.id))
    found = [
        s
        for s in states
        if (source is None or s.session_id == source) and (name is None or s.name == name)
    ]
    if params.get("nextToken"):
        after = _after(params["nextToken"])
        found = [s for s in found if (s.created_at, s.id) > after]
    page = found[:limit]
    headers = {"x-next-token": _cursor(page[-1])} if len(found) > limit else {}
    return JSONResponse([_info(s) for s in page], headers=headers)


async def delete_snapshot(request: Request) -> Response:
    """204, or 404 (the SDK's ``delete_snapshot`` returns False) for anything that is not one
    of the tenant's snapshots: templates are not built here, so there are none to delete."""
    service, _, tenant = caller(request)
    name = request.path_params["template_id"]
    state = snapshot_of(service, tenant, name)
    if state is None:
        raise E2BError(
            404,
            f"no snapshot {name!r} of yours (templates are not built by sandcell: a snapshot "
            "is the only template there is to delete)",
        )
    await service.in_thread(
        lambda: service.executor.delete_snapshot(name, owner=tenant.id), session=True
    )
    return Response(status_code=204)


async def start_from_snapshot(
    service: Service,
    registry: SandboxRegistry,
    tenant: Tenant,
    body: NewSandbox,
    snapshot: StoredState,
    *,
    auto_pause: AutoPause,
) -> E2BSandbox:
    """A new sandbox of the tenant's, started from ``snapshot`` (``templateID`` names it)."""
    check_profile(tenant, snapshot)
    name = body.template_id
    (session,) = await open_sessions(
        service,
        tenant,
        lambda: [service.executor.session(snapshot=name, owner=tenant.id, by=by(tenant))],
    )
    remembered = SandboxLabels.of(snapshot.labels)
    added = dict(body.env_vars or {})
    opening = Opening(
        template=name,
        metadata=dict(body.metadata or {}),
        env={**(remembered.env if remembered is not None else {}), **added},
        timeout_s=body.timeout,
        auto_pause=auto_pause,
        remembered=remembered,
        env_added=added,
    )
    return await adopt(service, registry, tenant, session, opening)


def snapshot_routes() -> list[Route]:
    return [
        Route("/sandboxes/{sandbox_id}/snapshots", create_snapshot, methods=["POST"]),
        Route("/snapshots", list_snapshots, methods=["GET"]),
        Route("/templates/{template_id}", delete_snapshot, methods=["DELETE"]),
    ]
