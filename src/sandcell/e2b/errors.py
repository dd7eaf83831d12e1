"""Failures in the shapes the E2B SDKs turn into their own exceptions.

The control plane and envd's HTTP endpoints answer ``{"code": STATUS, "message": TEXT}`` (the
SDK raises a raw JSON error on any other body); envd's Connect RPCs answer a Connect error code.
One :class:`E2BError` carries both, so a route raises it and its surface picks the form.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from sandcell.errors import ConfigError, InfraError, IsolationUnavailable, SandcellError
from sandcell.service.problems import ServiceProblem
from sandcell.sessions import SessionEnded

__all__ = ["E2BError", "connect_code", "from_exception", "json_error"]

_CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "already_exists",
    413: "resource_exhausted",
    429: "resource_exhausted",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


class E2BError(Exception):
    """A failure to answer with ``status`` and ``message`` (and, for a Connect RPC, ``code``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or connect_code(status)
        self.headers = dict(headers or {})


def connect_code(status: int) -> str:
    """The Connect error code for an HTTP status."""
    return _CONNECT_CODES.get(status, "internal" if status >= 500 else "unknown")


def json_error(err: E2BError) -> JSONResponse:
    return JSONResponse(
        {"code": err.status, "message": err.message}, status_code=err.status, headers=err.headers
    )


def from_exception(exc: Exception) -> E2BError | None:
    """The E2B form of what the service raises (a quota, a refused request), or None for a
    failure that is not the client's to see."""
    if isinstance(exc, E2BError):
        return exc
    if isinstance(exc, ServiceProblem):
        headers = dict(exc.headers)
        if exc.status == 429:
            # The SDK retries a 429 three times; a quota does not lift within its retries.
            headers["Should-Retry"] = "false"
        return E2BError(exc.status, exc.detail, headers=headers)
    if isinstance(exc, SessionEnded):
        return E2BError(502, f"the sandbox was not found: {exc}")
    if isinstance(exc, IsolationUnavailable | InfraError):
        return E2BError(503, str(exc), headers={"Should-Retry": "false"})
    if isinstance(exc, ConfigError):
        return E2BError(400, str(exc))
    if isinstance(exc, SandcellError):
        return None
    return None
