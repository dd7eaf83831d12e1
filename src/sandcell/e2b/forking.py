"""``Sandbox.fork`` (``POST /sandboxes/{id}/fork``): ``count`` new sandboxes, each a copy of
this one as it is now (:meth:`Session.fork <sandcell.sessions.Session.fork>`), with its memory
where the rung keeps it and its files everywhere; the sandbox goes on. A paused sandbox forks
too, and stays paused (:meth:`Executor.fork_paused <sandcell.executor.Executor.fork_paused>`).

Each copy is a sandbox of its own: its id, access token, timeout (the fork's ``timeout``) and
slot of the tenant's ``max_concurrent``; its template, metadata and environment are its
parent's.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError, from_exception
from sandcell.e2b.labels import SandboxLabels
from sandcell.e2b.opening import Opening, adopt
from sandcell.e2b.paused import paused_of
from sandcell.e2b.pausing import after_pause, by, chosen_mode
from sandcell.e2b.tenancy import caller
from sandcell.e2b.wire import ForkBody, parse, sandbox_json
from sandcell.service.saved_sessions import check_profile, check_room, open_sessions
from sandcell.sessions import Session

__all__ = ["fork_routes"]


async def fork(request: Request) -> Response:
    """201 with one entry per copy: ``{"sandbox": ...}``, or ``{"error": {"code",
    "message"}}`` for a copy that could not be set up. Copies start all or none: when the
    state cannot be restored, the call fails whole."""
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = parse(ForkBody, await request.body())
    await after_pause(service, registry, sandbox_id)
    box = registry.find(tenant.id, sandbox_id)
    opener: Callable[[], list[Session]]
    labels: SandboxLabels
    if box is not None:
        running = box
        mode = chosen_mode(running.session.pause_modes, None)
        await service.in_thread(lambda: check_room(service, tenant, running.session, mode))
        running.remember()
        labels = running.labels()

        def opener() -> list[Session]:
            return running.session.fork(body.count, mode=mode, by=by(tenant))

    else:
        paused = paused_of(service, tenant.id, sandbox_id)
        if paused is None:
            raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
        check_profile(tenant, paused.stored)
        labels = paused.labels

        def opener() -> list[Session]:
            return service.executor.fork_paused(
                sandbox_id, body.count, owner=tenant.id, by=by(tenant)
            )

    sessions = await open_sessions(service, tenant, opener, count=body.count)
    opening = Opening(
        template=labels.template,
        metadata=labels.metadata,
        env=labels.env,
        timeout_s=body.timeout,
        auto_pause=labels.auto_pause,
        remembered=labels,
    )
    results: list[dict[str, object]] = []
    for session in sessions:
        try:
            child = await adopt(service, registry, tenant, session, opening)
        except Exception as exc:
            err = from_exception(exc) or E2BError(500, "the copy could not be set up")
            results.append({"error": {"code": err.status, "message": err.message}})
        else:
            results.append({"sandbox": sandbox_json(child)})
    return JSONResponse(results, status_code=201)


def fork_routes() -> list[Route]:
    return [Route("/sandboxes/{sandbox_id}/fork", fork, methods=["POST"])]
