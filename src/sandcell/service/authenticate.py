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
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from sandcell.service.core import Service
from sandcell.service.deps import PRINCIPAL, principal_of
from sandcell.service.mcp_mount import MCP_PATH
from sandcell.service.problems import PROBLEM_JSON, ServiceProblem
from sandcell.service.ui.guard import MAX_FORM_BYTES, UI_PATH

__all__ = ["AuthenticateFirst"]


def _needs_key(path: str) -> bool:
    return path in (MCP_PATH, "/v1") or path.startswith("/v1/")


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


class AuthenticateFirst:
    """ASGI middleware, outermost: the key of a ``/v1`` or ``/mcp`` request is checked before
    its body is read; a ``/ui`` body declared over the form limit is refused unread."""

    def __init__(self, app: ASGIApp, *, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if _needs_key(path) and scope.get("method") != "OPTIONS":
            try:
                principal = principal_of(self.service, scope)
            except ServiceProblem as exc:
                await _refuse(send, exc.status, exc.detail, exc.headers or {})
                return
            if path == MCP_PATH and principal.role == "approver":
                await _refuse(
                    send,
                    403,
                    "an approver key decides approvals (/v1/approvals, /ui) and runs nothing; "
                    "send the tenant's API key to /mcp",
                    {},
                )
                return
            scope.setdefault("state", {})[PRINCIPAL] = principal
        elif path == UI_PATH or path.startswith(UI_PATH + "/"):
            declared = _declared_length(scope)
            if declared is not None and declared > MAX_FORM_BYTES:
                await _refuse(
                    send, 413, f"a form of these pages is at most {MAX_FORM_BYTES} bytes", {}
                )
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, detail: str, headers: dict[str, str]) -> None:
    titles = {401: "Unauthorized", 403: "Forbidden", 413: "Content Too Large"}
    body = json.dumps(
        {
            "type": "about:blank",
            "title": titles.get(status, "Error"),
            "status": status,
            "detail": detail,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                # The body was not read: the connection cannot carry another request.
                (b"connection", b"close"),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
