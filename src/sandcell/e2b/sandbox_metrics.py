"""``Sandbox.get_metrics`` (``GET /sandboxes/{id}/metrics``): the samples of the sandbox's
session (:meth:`Session.metrics <sandcell.sessions.Session.metrics>`: its CPU, memory and
workspace, taken by its watchdog and once more at each call), between ``start`` and ``end``
(Unix seconds). A paused sandbox has none: its samples went with its session."""

from __future__ import annotations

import datetime as dt

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError
from sandcell.e2b.paused import paused_of
from sandcell.e2b.tenancy import caller
from sandcell.e2b.wire import metric_json

__all__ = ["metrics_routes"]


def _unix(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise E2BError(400, f"{name}: give Unix seconds, a whole number") from None


async def metrics(request: Request) -> Response:
    service, registry, tenant = caller(request)
    sandbox_id = request.path_params["sandbox_id"]
    start, end = _unix(request, "start"), _unix(request, "end")
    box = registry.find(tenant.id, sandbox_id)
    if box is None:
        if paused_of(service, tenant.id, sandbox_id) is not None:
            return JSONResponse([])
        raise E2BError(404, f"sandbox {sandbox_id!r} was not found")
    samples = await service.in_thread(box.session.metrics, session=True)
    shown = [
        metric_json(m)
        for m in samples
        if (start is None or _unix_of(m.timestamp) >= start)
        and (end is None or _unix_of(m.timestamp) <= end)
    ]
    return JSONResponse(shown)


def _unix_of(timestamp: str) -> int:
    return int(dt.datetime.fromisoformat(timestamp).timestamp())


def metrics_routes() -> list[Route]:
    return [Route("/sandboxes/{sandbox_id}/metrics", metrics, methods=["GET"])]
