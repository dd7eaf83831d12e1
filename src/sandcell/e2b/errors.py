"""Failures in the shapes the E2B SDKs turn into their own exceptions.

The control plane and envd's HTTP endpoints answer ``{"code": STATUS, "message": TEXT}`` (the
SDK raises a raw JSON error on any other body); envd's Connect RPCs answer a Connect error code.
One :class:`E2BError` carries both, so a route raises it and its surface picks the form. What
sandcell's own errors become is their row in :mod:`sandcell.wire`.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from sandcell.errors import SandcellError
from sandcell.wire import SDK_RETRIED, connect_code, error_wire

__all__ = ["E2BError", "connect_code", "from_exception", "json_error"]


class E2BError(SandcellError):
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


def json_error(err: E2BError) -> JSONResponse:
    return JSONResponse(
        {"code": err.status, "message": err.message}, status_code=err.status, headers=err.headers
    )


def from_exception(exc: Exception) -> E2BError | None:
    """The E2B form of what the service raises (a quota, a refused request), or None for a
    failure that is not the client's to see."""
    if isinstance(exc, E2BError):
        return exc
    if not isinstance(exc, SandcellError):
        return None
    row = error_wire(exc)
    if not row.public:
        return None
    headers = dict(getattr(exc, "headers", None) or {})
    if row.e2b_status in SDK_RETRIED:
        # The SDK retries these three times at once; what sandcell refused does not change
        # within its retries (a quota, an ended sandbox, a host without the isolation).
        headers["Should-Retry"] = "false"
    message = row.e2b_message.format(str(exc))
    return E2BError(row.e2b_status, message, code=row.connect, headers=headers)
