"""Connect RPC framing (JSON codec) for envd's services: unary replies, stream envelopes.

A unary call is a bare JSON message each way. A server-streaming call sends one enveloped
message (a flag byte, a 4-byte big-endian length, the JSON) and gets back one envelope per
message, then an end-of-stream envelope (flag 2) holding ``{}`` or the error.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from sandcell.e2b.errors import E2BError

__all__ = [
    "STREAM_TYPE",
    "connect_error",
    "end_of_stream",
    "envelope",
    "read_message",
    "unary",
]

STREAM_TYPE = "application/connect+json"
_END = 0x02
_MAX_MESSAGE = 16 * 1024 * 1024


def envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return b"\x00" + len(data).to_bytes(4, "big") + data


def end_of_stream(error: E2BError | None = None) -> bytes:
    body: dict[str, Any] = {}
    if error is not None:
        body["error"] = {"code": error.code, "message": error.message}
    data = json.dumps(body).encode()
    return bytes([_END]) + len(data).to_bytes(4, "big") + data


def read_message(body: bytes, content_type: str) -> dict[str, Any]:
    """The request message of a unary (bare JSON) or streaming (enveloped) call."""
    if content_type.split(";", maxsplit=1)[0].strip().lower() == STREAM_TYPE:
        if len(body) < 5 or body[0] & 0x01:
            raise E2BError(400, "a streaming request needs one uncompressed envelope")
        size = int.from_bytes(body[1:5], "big")
        if size > _MAX_MESSAGE or len(body) < 5 + size:
            raise E2BError(400, "the request envelope is truncated or too large")
        body = body[5 : 5 + size]
    try:
        message = json.loads(body or b"{}")
    except ValueError:
        raise E2BError(
            400, "the request message is not JSON (only the JSON codec is served)"
        ) from None
    if not isinstance(message, dict):
        raise E2BError(400, "the request message is not a JSON object")
    return message


def unary(message: dict[str, Any]) -> Response:
    return JSONResponse(message)


def connect_error(err: E2BError) -> Response:
    return JSONResponse(
        {"code": err.code, "message": err.message}, status_code=err.status, headers=err.headers
    )
