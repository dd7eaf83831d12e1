"""``/v1/sessions``: one sandbox kept alive across cells, its files, its end."""

from __future__ import annotations

import asyncio
import base64
import shutil
import time
from collections.abc import Coroutine
from pathlib import PurePosixPath
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from sandcell.live_output import OutputListener
from sandcell.service import saved_sessions
from sandcell.service.api_runs import _DISCONNECT_POLL_S, _PROBLEMS
from sandcell.service.cell_stream import cell_events
from sandcell.service.core import LiveSession, Service
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.fast_json import FastJSONResponse
from sandcell.service.models import (
    CellBody,
    CellCancelBody,
    ResultBody,
    SessionBody,
    SessionCloseBody,
    SessionEndBody,
    SessionFilesBody,
    SessionInfoBody,
)
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import RunResult, artifact_to_dict, result_to_dict

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def _info(session: Session) -> SessionInfoBody:
    i = session.info()
    return SessionInfoBody(
        id=i.id,
        profile=i.profile,
        language=i.language,
        backend=i.backend,
        created_at=i.created_at,
        cells=i.cells,
        idle_timeout_s=i.idle_timeout_s,
        max_lifetime_s=i.max_lifetime_s,
        ended=i.ended,
        on_idle="pause" if i.on_idle == "pause" else "end",
        parent=i.parent,
    )


@router.post("", response_model=SessionInfoBody, status_code=201, responses=_PROBLEMS)
async def create_session(
    body: SessionBody, service: ServiceDep, tenant: CurrentTenant
) -> SessionInfoBody:
    """Start a session under one of the tenant's profiles; ``files`` are its inputs. With
    ``snapshot``, start it from that snapshot of the tenant's (its settings and state)."""
    if body.snapshot is not None:
        return await _from_snapshot(body, service, tenant)
    profile = service.profile_for(tenant, body.profile)
    limits = profile.limits_for(body.limits.model_dump() if body.limits is not None else None)
    service.admit(tenant, sandbox=True)
    folder = None
    try:
        folder, inputs = service.write_inputs(f"session-{time.time_ns()}", body.files)
        session = await service.in_thread(
            lambda: service.executor.session(
                profile=profile,
                limits=limits,
                inputs=inputs,
                idle_timeout_s=body.idle_timeout_s,
                max_lifetime_s=body.max_lifetime_s,
                runtime=body.runtime,
                language=body.language,
                on_idle=body.on_idle,
                paused_ttl_s=body.paused_ttl_s,
                owner=tenant.id,
                by=f"tenant:{tenant.name}",
            ),
            session=True,
        )
    except BaseException:
        service.quotas.release(tenant.id)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    service.add_session(
        LiveSession(
            tenant=tenant.id, session=session, inputs_dir=folder, key_sha256=tenant.key_sha256
        )
    )
    return _info(session)


async def _from_snapshot(body: SessionBody, service: Service, tenant: Tenant) -> SessionInfoBody:
    name = body.snapshot
    assert name is not None
    others = body.model_dump(exclude_defaults=True, exclude={"snapshot", "profile"})
    if others:
        raise ServiceProblem(
            400,
            f"a session started from a snapshot takes the snapshot's settings; leave out "
            f"{', '.join(sorted(others))}",
        )
    state = await service.in_thread(
        lambda: service.executor.states.find_snapshot(name, owner=tenant.id)
    )
    saved_sessions.check_profile(tenant, state)
    if body.profile is not None:
        service.profile_for(tenant, body.profile)
    (session,) = await saved_sessions.open_sessions(
        service,
        tenant,
        lambda: [
            service.executor.session(
                snapshot=name, profile=body.profile, owner=tenant.id, by=f"tenant:{tenant.name}"
            )
        ],
    )
    saved_sessions.hold(service, tenant, session)
    return _info(session)


def _live(service: Service, tenant: Tenant, session_id: str) -> LiveSession:
    service.reap_sessions()
    return service.session_for(tenant, session_id)


@router.get("", response_model=list[SessionInfoBody], responses=_PROBLEMS)
async def list_sessions(service: ServiceDep, tenant: CurrentTenant) -> list[SessionInfoBody]:
    """The tenant's live sessions."""
    service.reap_sessions()
    return [_info(live.session) for live in service.live_sessions(tenant)]


@router.get("/{session_id}", response_model=SessionInfoBody, responses=_PROBLEMS)
async def get_session(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> SessionInfoBody:
    return _info(_live(service, tenant, session_id).session)


async def _cell(
    service: Service,
    tenant: Tenant,
    live: LiveSession,
    code: str,
    *,
    timeout_s: float | None = None,
    exports: tuple[str, ...] = (),
    generated: bool = False,
    request: Request | None = None,
    on_output: OutputListener | None = None,
) -> RunResult:
    """Run one cell for the tenant; a ``request`` whose client goes away cancels it (as a
    synchronous run's does); ``on_output`` is told its output as it runs."""
    if not generated:  # the service's own cells (uploads) are bounded by the body limit
        service.check_code(code)
    service.admit(tenant, sandbox=False)
    began = time.monotonic()
    work = asyncio.ensure_future(
        service.in_thread(
            lambda: live.session.run(
                code, timeout_s=timeout_s, exports=exports, on_output=on_output
            ),
            session=True,
        )
    )
    if request is not None:
        await _cancel_if_gone(request, live, work)
    result: RunResult = await work
    service.own_result(tenant.id, result)
    service.metrics.finished(result.outcome.value, time.monotonic() - began)
    if live.session.ended is not None:
        service.end_session(live)
    return result


async def _cancel_if_gone(request: Request, live: LiveSession, work: asyncio.Future[Any]) -> None:
    """Wait for ``work`` (a cell); a client that disconnects first cancels the cell, which
    still ends and is recorded (killed, its session kept)."""
    while not work.done():
        await asyncio.wait({work}, timeout=_DISCONNECT_POLL_S)
        if not work.done() and await request.is_disconnected():
            live.session.cancel("the client went away")
            return


@router.post("/{session_id}/cells", response_model=ResultBody, responses=_PROBLEMS)
async def run_cell(
    session_id: str,
    body: CellBody,
    request: Request,
    service: ServiceDep,
    tenant: CurrentTenant,
) -> Response:
    """Run one cell; variables and files persist to the next. The result is a run too. A
    client that disconnects before the answer cancels the cell."""
    live = _live(service, tenant, session_id)
    result = await _cell(
        service,
        tenant,
        live,
        body.code,
        timeout_s=body.timeout_s,
        exports=tuple(body.exports),
        request=request,
    )
    # The executor's own JSON form, encoded once: not validated again on every cell's path.
    return FastJSONResponse(result_to_dict(result))


@router.post(
    "/{session_id}/cells/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **_PROBLEMS},
    response_class=StreamingResponse,
)
async def stream_cell(
    session_id: str, body: CellBody, service: ServiceDep, tenant: CurrentTenant
) -> StreamingResponse:
    """Run one cell as :func:`run_cell` does, answering with Server-Sent Events while it runs:
    ``stdout`` and ``stderr`` (``{"text"}``, redacted and capped as the result is), then
    ``result`` (the cell's result) or ``error`` (a problem document: the session ended, the
    service failed); the stream ends after it. A refusal before the cell starts (no such
    session, over quota, code too long) is an ordinary problem response. A client that goes
    away cancels the cell."""
    live = _live(service, tenant, session_id)

    def run(on_output: OutputListener) -> Coroutine[Any, Any, RunResult]:
        return _cell(
            service,
            tenant,
            live,
            body.code,
            timeout_s=body.timeout_s,
            exports=tuple(body.exports),
            on_output=on_output,
        )

    events = await cell_events(run, on_gone=lambda: live.session.cancel("the client went away"))
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{session_id}/cancel", response_model=CellCancelBody, status_code=202, responses=_PROBLEMS
)
async def cancel_cell(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> CellCancelBody:
    """Stop the cell now running in the session: it is interrupted as at its wall time (the
    session and its state are kept) and its own request answers with its result, ``killed``
    with a reason starting "cancelled". 409 when no cell is running."""
    live = _live(service, tenant, session_id)
    if not live.session.cancel("asked through the service"):
        raise ServiceProblem(409, f"no cell is running in session {session_id!r}")
    return CellCancelBody(id=session_id, cell_running=True)


@router.get("/{session_id}/files", response_model=SessionFilesBody, responses=_PROBLEMS)
async def list_files(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> SessionFilesBody:
    live = _live(service, tenant, session_id)
    files: list[str] = await service.in_thread(live.session.files, session=True)
    return SessionFilesBody(files=files)


def _relative(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise ServiceProblem(
            400, f"file path {path!r}: give a path relative to the workspace, without '..'"
        )
    return str(p)


@router.get(
    "/{session_id}/files/{path:path}",
    responses={200: {"content": {"application/octet-stream": {}}}, **_PROBLEMS},
)
async def download_file(
    session_id: str, path: str, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """A workspace file's bytes, exported by a cell (so the profile's export rules and the
    export checks apply, and the export is recorded)."""
    live = _live(service, tenant, session_id)
    wanted = _relative(path)
    result = await _cell(
        service, tenant, live, "pass", exports=(_glob_escape(wanted),), generated=True
    )
    for artifact in result.artifacts:
        if artifact.path == wanted:
            data = service.executor.store.path_for(artifact.sha256).read_bytes()
            return Response(
                data,
                media_type=artifact.media_type or "application/octet-stream",
                headers={"X-Sandcell-Sha256": artifact.sha256, "X-Sandcell-Run-Id": result.run_id},
            )
    why = next((r.reason for r in result.rejected_exports if r.path == wanted), None)
    if why is not None:
        raise ServiceProblem(403, f"{wanted!r} was not exported: {why}")
    if result.outcome.value != "ok":
        raise ServiceProblem(409, f"the export did not run: {result.reason}")
    raise ServiceProblem(404, f"no file {wanted!r} in session {session_id!r}")


def _glob_escape(path: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


@router.put("/{session_id}/files/{path:path}", response_model=ResultBody, responses=_PROBLEMS)
async def upload_file(
    session_id: str, path: str, request: Request, service: ServiceDep, tenant: CurrentTenant
) -> ResultBody:
    """Write the request body to a workspace file, by a cell that writes it (so the upload is
    recorded as a run of the session, and a sandbox limit on files applies)."""
    live = _live(service, tenant, session_id)
    wanted = _relative(path)
    data = await request.body()
    code = (
        "import base64 as _b, pathlib as _p\n"
        f"_f = _p.Path({wanted!r})\n"
        "_f.parent.mkdir(parents=True, exist_ok=True)\n"
        f"_f.write_bytes(_b.b64decode({base64.b64encode(data).decode()!r}))\n"
        "del _b, _p, _f\n"
    )
    result = await _cell(service, tenant, live, code, generated=True)
    if result.outcome.value != "ok":
        raise ServiceProblem(
            409, f"the upload did not complete: {result.reason or result.stderr[-500:]}"
        )
    return ResultBody.model_validate(result_to_dict(result))


async def _close(service: Service, live: LiveSession, exports: tuple[str, ...]) -> SessionEndBody:
    try:
        end = await service.in_thread(lambda: live.session.close(exports=exports), session=True)
    finally:
        if live.session.ended is not None:
            service.end_session(live)
    artifacts = [(a.sha256, a.size) for a in end.artifacts]
    service.tenants.own_artifacts(live.tenant, artifacts)
    return SessionEndBody(
        id=live.session.id,
        reason=end.reason,
        artifacts=[artifact_to_dict(a) for a in end.artifacts],
        rejected_exports=[{"path": r.path, "reason": r.reason} for r in end.rejected_exports],
    )


@router.post("/{session_id}/close", response_model=SessionEndBody, responses=_PROBLEMS)
async def close_session(
    session_id: str, body: SessionCloseBody, service: ServiceDep, tenant: CurrentTenant
) -> SessionEndBody:
    """End the session, exporting the workspace files matching ``exports`` first."""
    return await _close(service, _live(service, tenant, session_id), tuple(body.exports))


@router.delete("/{session_id}", response_model=SessionEndBody, responses=_PROBLEMS)
async def delete_session(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> SessionEndBody:
    """End the session; nothing is exported."""
    return await _close(service, _live(service, tenant, session_id), ())
