"""The parts of E2B's API sandcell does not serve, each answered 501 with the reason.

A call the SDK makes to one of these gets ``{"code": 501, "message": ...}`` (the SDKs raise it
as a ``SandboxException`` with the message; on the envd RPCs, the Connect code
``unimplemented``), never a 404 the SDK would read as "sandbox not found". docs/e2b.md has the
same list.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.e2b.errors import E2BError

__all__ = ["UNSERVED", "unserved_routes"]

_NO_TEMPLATES = (
    "templates are not built by sandcell: a sandbox runs under one of the tenant's profiles "
    "(pass the profile's name as the template), with the runtime sandcell ships"
)
UNSERVED: tuple[tuple[str, str, str], ...] = (
    (
        "PUT",
        "/sandboxes/{sandbox_id}/network",
        "network rules come from the tenant's profile ([network] hosts), not from the client",
    ),
    (
        "GET",
        "/sandboxes/metrics",
        "metrics of several sandboxes at once are not served; ask each sandbox "
        "(GET /sandboxes/{sandboxID}/metrics, Sandbox.get_metrics)",
    ),
    (
        "GET",
        "/sandboxes/{sandbox_id}/logs",
        "sandbox logs are not served; every cell and command is in the record (GET /v1/audit)",
    ),
    ("GET", "/v2/sandboxes/{sandbox_id}/logs", "sandbox logs are not served; see GET /v1/audit"),
    ("GET", "/templates", _NO_TEMPLATES),
    ("GET", "/v2/templates", _NO_TEMPLATES),
    ("POST", "/v3/templates", _NO_TEMPLATES),
    ("GET", "/default-templates", _NO_TEMPLATES),
    ("GET", "/templates/{rest:path}", _NO_TEMPLATES),
    ("POST", "/templates/{rest:path}", _NO_TEMPLATES),
    ("PATCH", "/templates/{rest:path}", _NO_TEMPLATES),
    ("DELETE", "/templates/{rest:path}", _NO_TEMPLATES),
    ("POST", "/v2/templates/{rest:path}", _NO_TEMPLATES),
    ("PATCH", "/v2/templates/{rest:path}", _NO_TEMPLATES),
    ("GET", "/volumes", "volumes are not served: files live in the sandbox's workspace"),
    ("POST", "/volumes", "volumes are not served: files live in the sandbox's workspace"),
    ("GET", "/volumes/{rest:path}", "volumes are not served"),
    ("DELETE", "/volumes/{rest:path}", "volumes are not served"),
    (
        "GET",
        "/secrets",
        "secrets are not served: a profile's governed tools hold credentials outside the sandbox",
    ),
    ("POST", "/secrets", "secrets are not served"),
    ("GET", "/secrets/{rest:path}", "secrets are not served"),
    ("POST", "/secrets/{rest:path}", "secrets are not served"),
    ("DELETE", "/secrets/{rest:path}", "secrets are not served"),
)


def _answer(method: str, path: str, why: str) -> Route:
    async def endpoint(request: Request) -> Response:
        raise E2BError(501, f"{method} {path}: {why}", headers={"Should-Retry": "false"})

    return Route(path, endpoint, methods=[method])


def unserved_routes() -> list[Route]:
    return [_answer(method, path, why) for method, path, why in UNSERVED]
