"""Errors as ``application/problem+json`` (RFC 9457), and the body-size guard.

Every failure a client can cause gets a 4xx saying what was wrong; anything unexpected is
logged here with its traceback and answered 500 with no internals in the body. A sandcell
error's status and whether its sentence may be shown are its row in :mod:`sandcell.wire`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.errors import AuditError, SandcellError, StoreUnavailable
from sandcell.wire import error_wire, title

__all__ = ["BodyLimit", "ServiceProblem", "install_handlers", "problem_response"]

log = logging.getLogger("sandcell.service")
PROBLEM_JSON = "application/problem+json"
STORE_RETRY_AFTER_S = 2
"""What a 503 for an unreachable database tells the client to wait: a restart takes seconds."""


class ServiceProblem(SandcellError):
    """A failure to answer as a problem document with ``status`` (its row in
    :mod:`sandcell.wire` follows the status)."""

    def __init__(
        self, status: int, detail: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})


def problem_response(
    status: int,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, object] = {
        "type": "about:blank",
        "title": title(status),
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(
        body, status_code=status, headers=dict(headers or {}), media_type=PROBLEM_JSON
    )


def _field(loc: tuple[int | str, ...] | list[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def install_handlers(app: FastAPI) -> None:
    """Map every exception an endpoint can raise to its problem document."""

    def count(request: Request, status: int) -> None:
        metrics = getattr(getattr(request.app.state, "service", None), "metrics", None)
        rejected = getattr(metrics, "rejected", None)
        if callable(rejected):
            rejected(status)

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceProblem)
        count(request, exc.status)
        return problem_response(exc.status, exc.detail, headers=exc.headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        count(request, 422)
        errors = [
            {
                "field": _field(e.get("loc", ())),
                "message": str(e.get("msg", "")),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": "", "message": "invalid"}
        return problem_response(422, f"{first['field']}: {first['message']}", errors=errors)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return problem_response(exc.status_code, str(exc.detail), headers=exc.headers)

    async def on_sandcell(request: Request, exc: Exception) -> JSONResponse:
        row = error_wire(exc)
        if row.public:
            if row.http_status == 400:  # a refused request; an ended session is not one
                count(request, row.http_status)
            return problem_response(row.http_status, str(exc))
        if isinstance(exc, StoreUnavailable):
            log.error("database unreachable on %s %s: %s", request.method, request.url.path, exc)
            count(request, row.http_status)
            headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
            return problem_response(row.http_status, row.detail, headers=headers)
        if isinstance(exc, AuditError):
            log.error("audit log error on %s %s: %s", request.method, request.url.path, exc)
            return problem_response(row.http_status, row.detail)
        return await on_unexpected(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "the service failed to answer; its log has the details")

    app.add_exception_handler(ServiceProblem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(SandcellError, on_sandcell)
    app.add_exception_handler(Exception, on_unexpected)


_FORM = b"application/x-www-form-urlencoded"
_DRAIN_BYTES = 64 * 1024 * 1024
"""A body over the limit but under this is read (and dropped) before the 413, so that the
client, still sending, reads the answer instead of a connection reset."""


async def _discard(receive: Receive) -> None:
    size = 0
    while size <= _DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _as_json(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k != b"content-type"]
    return [*kept, (b"content-type", b"application/json")]


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 before any endpoint
    sees it (by its Content-Length, or by counting when it is chunked)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if scope.get("method") == "POST" and headers.get(b"content-type", _FORM) == _FORM:
            # No endpoint takes a form: a body sent with curl's default type (-d) or none is
            # the JSON the endpoint expects, so read it as such.
            scope = {**scope, "headers": _as_json(scope.get("headers") or ())}
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= _DRAIN_BYTES:
                await _discard(receive)
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        disconnected: Message | None = None
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                if more and size <= _DRAIN_BYTES:
                    await _discard(receive)
                await self._refuse(send)
                return
            chunks.append(body)
            more = bool(message.get("more_body", False))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if disconnected is not None:
                    return disconnected
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "type": "about:blank",
                "title": title(413),
                "status": 413,
                "detail": f"the request body is over {self.max_bytes} bytes; send less "
                "(large inputs belong in files of a session)",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
