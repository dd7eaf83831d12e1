"""E2B's signed file URLs (``download_url``, ``upload_url``): a file read or written with no
headers, by whoever holds the URL.

The SDK signs the URL itself, with the sandbox's access token: ``v1_`` and the unpadded base64
SHA-256 of ``path:operation:user:token`` (``:expiration`` appended when the URL expires). So a
signature holds for one sandbox (its token), one path, one operation (``read`` for a download,
``write`` for an upload) and, when given, until its expiration (Unix seconds). It stops holding
when the sandbox ends, whatever ends it (its tenant's key rotated included, which ends the
sandboxes opened with the old key): only live sandboxes' tokens are tried.

The SDK builds the URL from ``E2B_SANDBOX_URL`` joined with ``/files``, which drops the URL's
own path: the service answers ``/files`` at its root as well as under ``/e2b``. The URL names
no sandbox, so the signature is checked against each live sandbox's token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Literal

from starlette.requests import Request

from sandcell.e2b.errors import E2BError
from sandcell.e2b.registry import E2BSandbox, SandboxRegistry

__all__ = ["Operation", "signature_for", "signed_sandbox"]

Operation = Literal["read", "write"]


def signature_for(
    path: str, operation: Operation, user: str, token: str, expiration: int | None
) -> str:
    """The signature the E2B SDK makes (``e2b/sandbox/signature.py``)."""
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def signed_sandbox(request: Request, operation: Operation) -> E2BSandbox | None:
    """The sandbox whose token signed this request's URL for ``operation`` on its path; None
    when the URL carries no signature (the call then needs the sandbox's headers); 401 when
    the signature is wrong, expired, or its sandbox has ended."""
    params = request.query_params
    signature = params.get("signature")
    if signature is None:
        return None
    raw_expiration = params.get("signature_expiration")
    expiration: int | None = None
    if raw_expiration is not None:
        try:
            expiration = int(raw_expiration)
        except ValueError:
            raise E2BError(401, "signature_expiration: give Unix seconds, as signed") from None
    path = params.get("path") or ""
    user = params.get("username") or ""
    registry = request.app.state.registry
    assert isinstance(registry, SandboxRegistry)
    found = None
    for box in registry.live():
        wanted = signature_for(path, operation, user, box.token, expiration)
        # Every live sandbox is tried, the match never cut short: the time taken tells
        # nothing about which token came close.
        if hmac.compare_digest(wanted.encode(), signature.encode()):
            found = box
    if found is None:
        raise E2BError(
            401,
            f"the signature does not hold for {operation} of {path!r}: it was made for another "
            "path or operation, or its sandbox has ended",
        )
    if expiration is not None and time.time() > expiration:
        raise E2BError(401, "the signed URL has expired; ask the SDK for a new one")
    return found
