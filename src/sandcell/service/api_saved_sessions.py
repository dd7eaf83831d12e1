"""Sessions that last, over HTTP: pause and resume, snapshots, forks, and a live session's
resource samples.

``POST /v1/sessions/{id}/pause`` saves a live session under the service's home and ends its
sandbox; ``GET /v1/paused`` lists the tenant's paused sessions and ``POST
/v1/sessions/{id}/resume`` brings one back under its id (also after the service restarted).
``POST /v1/sessions/{id}/snapshots`` keeps a named copy (``POST /v1/sessions`` with
``snapshot`` starts sessions from it), ``POST /v1/sessions/{id}/fork`` makes live copies of a
live or a paused session. Every saved state is the tenant's (another tenant's is 404), counts in
its ``max_stored_bytes`` (:mod:`sandcell.service.saved_sessions`), and each step is an entry of
the audit chain the tenant sees in ``/v1/audit``.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from sandcell.backends.cell.state import PauseMode
from sandcell.service import saved_sessions
from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.api_sessions import _info, _live
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.models import (
    ForkBody,
    ForkedBody,
    MetricsBody,
    PauseBody,
    SessionInfoBody,
    SnapshotBody,
    StateBody,
)
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.sessions.states import StateNotFound, StoredState

__all__ = ["router"]

router = APIRouter(tags=["saved sessions"])


def _state(state: StoredState) -> StateBody:
    return StateBody.model_validate(state.summary())


def _by(tenant: Tenant) -> str:
    return f"tenant:{tenant.name}"


@router.post("/v1/sessions/{session_id}/pause", response_model=StateBody, responses=_PROBLEMS)
async def pause_session(
    session_id: str, body: PauseBody, service: ServiceDep, tenant: CurrentTenant
) -> StateBody:
    """Pause a live session: its state (``memory``: variables, processes and files; ``files``:
    the workspace's files) is saved and its sandbox ends, giving back its slot. 422 for a mode
    its rung does not offer (the session goes on); 429 when the state would take the tenant
    over its stored bytes."""
    live = _live(service, tenant, session_id)
    mode = PauseMode(body.mode)
    await service.in_thread(
        lambda: saved_sessions.check_room(service, tenant, live.session, mode), session=True
    )
    try:
        state = await service.in_thread(
            lambda: live.session.pause(mode=mode, by=_by(tenant)), session=True
        )
    finally:
        if live.session.ended is not None:
            service.end_session(live)
    return _state(state)


@router.get("/v1/paused", response_model=list[StateBody], responses=_PROBLEMS)
async def list_paused(service: ServiceDep, tenant: CurrentTenant) -> list[StateBody]:
    """The tenant's paused sessions, oldest first."""
    service.reap_sessions()  # an idle session that paused itself is listed, not also live
    found = await service.in_thread(lambda: service.executor.paused(owner=tenant.id))
    return [_state(s) for s in found]


def _paused(service: ServiceDep, tenant: Tenant, session_id: str) -> StoredState:
    state = service.executor.states.get(session_id, owner=tenant.id)
    if state.kind != "paused":
        raise StateNotFound(f"no paused session {session_id}")
    return state


async def _forget(
    service: ServiceDep, tenant: Tenant, delete: Callable[[], StoredState]
) -> StateBody:
    """``delete`` on a worker thread, then drop the inputs the state kept (its bytes stop
    counting); the state that was."""

    def forget() -> StoredState:
        state = delete()
        saved_sessions.drop_inputs(service, tenant.id, state)
        return state

    return _state(await service.in_thread(forget))


@router.get("/v1/paused/{session_id}", response_model=StateBody, responses=_PROBLEMS)
async def get_paused(session_id: str, service: ServiceDep, tenant: CurrentTenant) -> StateBody:
    return _state(await service.in_thread(lambda: _paused(service, tenant, session_id)))


@router.delete("/v1/paused/{session_id}", response_model=StateBody, responses=_PROBLEMS)
async def delete_paused(session_id: str, service: ServiceDep, tenant: CurrentTenant) -> StateBody:
    """Forget a paused session for good (its bytes stop counting)."""
    return await _forget(
        service, tenant, lambda: service.executor.delete_paused(session_id, owner=tenant.id)
    )


@router.post(
    "/v1/sessions/{session_id}/resume", response_model=SessionInfoBody, responses=_PROBLEMS
)
async def resume_session(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> SessionInfoBody:
    """Bring a paused session back, live, under its id, profile and limits; its paused state is
    consumed. 404 when the tenant has no such paused session; 409 when its saved files changed
    on disk (it is never loaded)."""
    service.reap_sessions()
    state = await service.in_thread(lambda: _paused(service, tenant, session_id))
    saved_sessions.check_profile(tenant, state)
    (session,) = await saved_sessions.open_sessions(
        service,
        tenant,
        lambda: [service.executor.resume(session_id, owner=tenant.id, by=_by(tenant))],
    )
    saved_sessions.hold(service, tenant, session)
    return _info(session)


@router.post(
    "/v1/sessions/{session_id}/fork",
    response_model=ForkedBody,
    status_code=201,
    responses=_PROBLEMS,
)
async def fork_session(
    session_id: str, body: ForkBody, service: ServiceDep, tenant: CurrentTenant
) -> ForkedBody:
    """``n`` new live sessions, each a copy of the session as it is now (a live one goes on, a
    paused one stays paused), each with its own id and a sandbox slot of the tenant's: all or
    none (429 when the slots or the stored bytes are not there)."""
    mode = PauseMode(body.mode)
    service.reap_sessions()
    live = None
    if any(s.session.id == session_id for s in service.live_sessions(tenant)):
        live = _live(service, tenant, session_id)
        await service.in_thread(
            lambda: saved_sessions.check_room(service, tenant, live.session, mode), session=True
        )
    else:
        state = await service.in_thread(lambda: _paused(service, tenant, session_id))
        saved_sessions.check_profile(tenant, state)

    def opener() -> list[Session]:
        if live is not None:
            return live.session.fork(body.n, mode=mode, by=_by(tenant))
        return service.executor.fork_paused(session_id, body.n, owner=tenant.id, by=_by(tenant))

    forks = await saved_sessions.open_sessions(service, tenant, opener, count=body.n)
    for fork in forks:
        saved_sessions.hold(service, tenant, fork)
    return ForkedBody(parent=session_id, sessions=[_info(f) for f in forks])


@router.post(
    "/v1/sessions/{session_id}/snapshots",
    response_model=StateBody,
    status_code=201,
    responses=_PROBLEMS,
)
async def snapshot_session(
    session_id: str, body: SnapshotBody, service: ServiceDep, tenant: CurrentTenant
) -> StateBody:
    """Keep a named copy of the session's state (one of that name is replaced); the session
    goes on. Start sessions from it with ``POST /v1/sessions {"snapshot": name}``."""
    live = _live(service, tenant, session_id)
    mode = PauseMode(body.mode)
    await service.in_thread(
        lambda: saved_sessions.check_room(service, tenant, live.session, mode), session=True
    )
    state = await service.in_thread(
        lambda: live.session.snapshot(body.name, mode=mode, ttl_s=body.ttl_s, by=_by(tenant)),
        session=True,
    )
    return _state(state)


@router.get("/v1/snapshots", response_model=list[StateBody], responses=_PROBLEMS)
async def list_snapshots(service: ServiceDep, tenant: CurrentTenant) -> list[StateBody]:
    """The tenant's snapshots, oldest first."""
    found = await service.in_thread(lambda: service.executor.snapshots(owner=tenant.id))
    return [_state(s) for s in found]


@router.delete("/v1/snapshots/{name}", response_model=StateBody, responses=_PROBLEMS)
async def delete_snapshot(name: str, service: ServiceDep, tenant: CurrentTenant) -> StateBody:
    """Forget a snapshot; sessions started from it go on."""
    return await _forget(
        service, tenant, lambda: service.executor.delete_snapshot(name, owner=tenant.id)
    )


@router.get(
    "/v1/sessions/{session_id}/metrics", response_model=list[MetricsBody], responses=_PROBLEMS
)
async def session_metrics(
    session_id: str, service: ServiceDep, tenant: CurrentTenant, since: str | None = None
) -> list[MetricsBody]:
    """The session's resource samples at or after ``since`` (ISO 8601; default: all kept, about
    an hour), oldest first, with one taken now when no cell runs."""
    live = _live(service, tenant, session_id)
    samples = await service.in_thread(lambda: live.session.metrics(since), session=True)
    return [MetricsBody.model_validate(s.to_dict()) for s in samples]
