"""Authentication before the body: a request that needs a key is refused before a byte of its
body is read.

The body guard (:class:`~sandcell.service.problems.BodyLimit`) reads a body whole (up to the
service's limit) before any endpoint runs; without this middleware in front of it, anyone who
can reach the port could make the service hold megabytes per connection without a key. Here
``/v1`` and ``/mcp`` requests have their key checked from the headers alone: a missing, unknown
or revoked key is answered 401 and the connection closed, its body never read. The principal
found is handed to the endpoint in the request's scope (:data:`sandcell.service.deps.PRINCIPAL`),
so the key is looked up once. ``/ui`` bodies (its forms, the login with the key among them) are
refused past the form limit by their declared length, before they are read.

E2B requests that carry a body (``/e2b/...`` and the signed-URL ``/files``) are checked the same
way, by what E2B sends: a tenant's key in ``X-API-KEY``, or a sandbox's id and access token
(``E2b-Sandbox-Id`` with ``X-Access-Token`` or ``E2B-Traffic-Access-Token``); a wrong one, or
none at all, is answered in E2B's error shape before the body is read. A signed upload URL
(``?signature=``) is checked by the E2B app itself, against every live sandbox's token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from sandcell.e2b import E2B_PATH
from sandcell.errors import StoreUnavailable
from sandcell.service.core import Service
from sandcell.service.deps import PRINCIPAL, principal_of
from sandcell.service.mcp_mount import MCP_PATH
from sandcell.service.problems import STORE_RETRY_AFTER_S, ServiceProblem, problem_response
from sandcell.service.ui.guard import MAX_FORM_BYTES, UI_PATH
from sandcell.wire import error_wire

log = logging.getLogger("sandcell.service")

__all__ = ["AuthenticateFirst"]


def _needs_key(path: str) -> bool:
    return path in (MCP_PATH, "/v1") or path.startswith("/v1/")


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
E2BCheck = Callable[[str, str | None], object]
"""Raises the E2B app's error when a sandbox id and its token do not match a live sandbox."""


def _header(scope: Scope, name: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _is_e2b(path: str) -> bool:
    return path.startswith(E2B_PATH + "/") or path == "/files"


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


class AuthenticateFirst:
    """ASGI middleware, outermost: the key of a ``/v1`` or ``/mcp`` request is checked before
    its body is read; a ``/ui`` body declared over the form limit is refused unread."""

    def __init__(
        self, app: ASGIApp, *, service: Service, e2b_reached: E2BCheck | None = None
    ) -> None:
        self.app = app
        self.service = service
        self.e2b_reached = e2b_reached

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if _needs_key(path) and scope.get("method") != "OPTIONS":
            try:
                principal = principal_of(self.service, scope)
            except ServiceProblem as exc:
                await _refuse(
                    scope, receive, send, exc.status, exc.detail, headers=exc.headers or {}
                )
                return
            except StoreUnavailable as exc:
                # Outside the app's handlers: the tenant store's database is down, which is
                # the 503 with Retry-After they would answer, not an internal error.
                await _unavailable(scope, receive, send, exc)
                return
            if path == MCP_PATH and principal.role == "approver":
                await _refuse(
                    scope,
                    receive,
                    send,
                    403,
                    "an approver key decides approvals (/v1/approvals, /ui) and runs nothing; "
                    "send the tenant's API key to /mcp",
                    headers={},
                )
                return
            scope.setdefault("state", {})[PRINCIPAL] = principal
        elif _is_e2b(path) and scope.get("method") in _BODY_METHODS:
            try:
                refused = self._e2b_refusal(scope)
            except StoreUnavailable as exc:
                await _unavailable(scope, receive, send, exc)
                return
            if refused is not None:
                await _refuse_e2b(send, *refused)
                return
        elif path == UI_PATH or path.startswith(UI_PATH + "/"):
            declared = _declared_length(scope)
            if declared is not None and declared > MAX_FORM_BYTES:
                limit = f"a form of these pages is at most {MAX_FORM_BYTES} bytes"
                await _refuse(scope, receive, send, 413, limit, headers={})
                return
        await self.app(scope, receive, send)

    def _e2b_refusal(self, scope: Scope) -> tuple[int, str] | None:
        """Why an E2B request with a body is refused before it is read (None: it goes on)."""
        key = _header(scope, b"x-api-key")
        if key is not None:
            if self.service.tenants.authenticate(key) is None:
                return 401, "unknown or revoked API key"
            return None
        sandbox_id = _header(scope, b"e2b-sandbox-id")
        token = _header(scope, b"x-access-token") or _header(scope, b"e2b-traffic-access-token")
        if sandbox_id and token is not None:
            if self.e2b_reached is not None:
                try:
                    self.e2b_reached(sandbox_id, token)
                except Exception as exc:  # the E2B app's own error: its status and words
                    status = getattr(exc, "status", 401)
                    return int(status), str(getattr(exc, "message", exc))
            return None
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "signature" in query or _header(scope, b"authorization") is not None:
            return None  # a signed URL or another scheme: the E2B app decides
        return 401, (
            "send a tenant's API key as X-API-KEY (E2B_API_KEY), or the sandbox's id and access "
            "token (E2b-Sandbox-Id, X-Access-Token)"
        )


async def _refuse_e2b(send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, detail: str, *, headers: dict[str, str]
) -> None:
    # The body was not read: the connection cannot carry another request.
    response = problem_response(status, detail, headers={**headers, "connection": "close"})
    await response(scope, receive, send)


async def _unavailable(scope: Scope, receive: Receive, send: Send, exc: StoreUnavailable) -> None:
    """503 with Retry-After for a key that cannot be checked: the database is unreachable."""
    log.error("database unreachable checking a key on %s: %s", scope.get("path", ""), exc)
    detail = error_wire(exc).detail
    await _refuse(
        scope, receive, send, 503, detail, headers={"Retry-After": str(STORE_RETRY_AFTER_S)}
    )
