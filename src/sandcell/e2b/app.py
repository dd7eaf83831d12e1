"""The E2B API as one ASGI application, mounted by the service at ``/e2b``.

The SDKs send the control plane and all sandbox traffic (envd and the interpreter) to the same
base URL when ``E2B_SANDBOX_URL`` is set; the paths do not overlap except ``/health``, which is
told apart by the ``E2b-Sandbox-Port`` header. Errors take the form each surface's SDK code
reads: Connect errors on the RPC paths (on a stream, in its end message), ``{"code",
"message"}`` elsewhere.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of
from sandcell.e2b.connect_rpc import STREAM_TYPE, connect_error, end_of_stream
from sandcell.e2b.control import control_routes
from sandcell.e2b.errors import E2BError, from_exception, json_error
from sandcell.e2b.files import file_routes
from sandcell.e2b.forking import fork_routes
from sandcell.e2b.interpreter import interpreter_routes
from sandcell.e2b.pausing import pause_routes
from sandcell.e2b.process import process_routes
from sandcell.e2b.registry import SandboxRegistry
from sandcell.e2b.sandbox_metrics import metrics_routes
from sandcell.e2b.snapshots import snapshot_routes
from sandcell.e2b.unserved import unserved_routes
from sandcell.e2b.watch import watch_routes
from sandcell.errors import SandcellError
from sandcell.service.core import Service
from sandcell.service.problems import ServiceProblem
from sandcell.wire import error_wire

__all__ = ["e2b_app"]

log = logging.getLogger("sandcell.e2b")
_STREAMS = (
    "/process.Process/Start",
    "/process.Process/Connect",
    "/process.Process/StreamInput",
    "/filesystem.Filesystem/WatchDir",
)


async def health(request: Request) -> Response:
    if request.headers.get("e2b-sandbox-id"):
        sandbox_of(request)
    return Response(status_code=204)


def _respond(request: Request, err: E2BError) -> Response:
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    if path in _STREAMS:
        # A server stream reports its errors in its end message, after a 200.
        return Response(end_of_stream(err), media_type=STREAM_TYPE, headers=err.headers)
    first = path.lstrip("/").split("/", 1)[0]
    if "." in first:
        return connect_error(err)
    return json_error(err)


async def _on_error(request: Request, exc: Exception) -> Response:
    err = from_exception(exc)
    if err is None:
        # Kept to the log (sandcell.wire: not public); the client gets the row's sentence.
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        row = error_wire(exc)
        err = E2BError(row.e2b_status, row.detail)
    return _respond(request, err)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _respond(
        request,
        E2BError(
            404,
            f"{request.method} {request.url.path} is not part of the E2B API served "
            "here (docs/e2b.md lists what is)",
        ),
    )


def e2b_app(service: Service) -> Starlette:
    """The E2B API over ``service``: its tenants, quotas, executor and record."""
    routes = [
        Route("/health", health, methods=["GET"]),
        # Before the unserved templates: DELETE /templates/{id} deletes a snapshot.
        *snapshot_routes(),
        # Before the control plane: /sandboxes/metrics would otherwise be read as the sandbox
        # "metrics".
        *unserved_routes(),
        *control_routes(),
        *pause_routes(),
        *fork_routes(),
        *metrics_routes(),
        *file_routes(),
        *watch_routes(),
        *process_routes(),
        *interpreter_routes(),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            E2BError: _on_error,
            ServiceProblem: _on_error,
            SandcellError: _on_error,
            Exception: _on_error,
            404: _not_found,
            405: _not_found,
        },
    )
    registry = SandboxRegistry(service)
    app.state.service = service
    app.state.registry = registry

    async def pause_for_stop() -> None:
        await service.in_thread(registry.pause_for_stop, session=True)

    service.on_stop.append(pause_for_stop)
    return app
