"""The service's answers that are not results, as sandcell's own errors.

A problem document (4xx) is a :class:`ServiceError`, a :class:`~sandcell.errors.ConfigError`
carrying the status and the service's ``detail`` (what was wrong and how to fix it); over a
quota (429) it is a :class:`QuotaExceeded` with the ``Retry-After`` delay; a cell sent to a
session that has ended is :class:`~sandcell.sessions.SessionEnded`, as in-process. A 503
whose detail carries an isolation fix is a :class:`ServiceIsolationUnavailable`, an
:class:`~sandcell.errors.IsolationUnavailable` as in-process (no retry mends it). Any other
5xx, a service that cannot be reached or a connection that broke is a
:class:`ServiceUnavailable`, an :class:`~sandcell.errors.InfraError` (safe to retry: nothing
ran, or the run is recorded). :func:`answer_class` is that choice, which the command line
(:mod:`sandcell.cli.remote`) makes the same way; each class's exit code and retry are its row in
:mod:`sandcell.wire`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sandcell.errors import ConfigError, InfraError, IsolationUnavailable, SandcellError

__all__ = [
    "QuotaExceeded",
    "ServiceError",
    "ServiceIsolationUnavailable",
    "ServiceUnavailable",
    "answer_class",
    "error_for",
]


class ServiceError(ConfigError):
    """The service refused the request (a 4xx problem): ``status``, ``detail`` and, for a body
    that did not fit the schema, ``errors`` (each with its ``field``)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        detail: str,
        errors: tuple[Mapping[str, object], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.errors = errors


class QuotaExceeded(ServiceError):
    """Over one of the tenant's quotas (429); ``retry_after_s`` is when to try again."""

    def __init__(self, message: str, *, detail: str, retry_after_s: float | None) -> None:
        super().__init__(message, status=429, detail=detail)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(InfraError):
    """The service could not be reached, broke the connection, or failed (5xx)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServiceIsolationUnavailable(IsolationUnavailable):
    """The service cannot enforce the isolation the request needs (a 503 with a fix): the
    service's sentence, which names the missing piece and the fix, is the message."""

    def __init__(self, message: str, *, status: int = 503) -> None:
        RuntimeError.__init__(self, message)
        self.layer = "service"
        self.reason = message
        self.fix = ""
        self.status = status


def answer_class(status: int, detail: str) -> type[SandcellError]:
    """The class of error for a non-2xx answer with ``detail``; the one choice the client and
    the command line make alike."""
    if status == 503 and "Fix:" in detail:
        return ServiceIsolationUnavailable
    if status >= 500:
        return ServiceUnavailable
    if status == 429:
        return QuotaExceeded
    return ServiceError


def _problem(body: bytes) -> tuple[str, tuple[Mapping[str, object], ...]]:
    """The detail and field errors of a problem document; the raw text if it is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace").strip()[:500], ()
    if not isinstance(data, dict):
        return str(data)[:500], ()
    detail = str(data.get("detail") or data.get("title") or "")
    raw = data.get("errors")
    errors = tuple(e for e in raw if isinstance(e, dict)) if isinstance(raw, list) else ()
    return detail, errors


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: not what the service sends


def error_for(
    status: int, body: bytes, headers: Mapping[str, str], *, what: str, where: str
) -> Exception:
    """The exception for a non-2xx answer to ``what`` (e.g. ``POST /v1/runs``) from the
    service at ``where``."""
    detail, errors = _problem(body)
    kind = answer_class(status, detail)
    if kind is ServiceIsolationUnavailable:
        return ServiceIsolationUnavailable(detail, status=status)
    if kind is ServiceUnavailable:
        return ServiceUnavailable(
            f"the sandcell service at {where} failed ({status}) on {what}: "
            f"{detail or 'no detail'}; the service's log has the cause",
            status=status,
        )
    if kind is QuotaExceeded:
        wait = _retry_after(headers.get("retry-after"))
        hint = f"; retry in {wait:g} s" if wait is not None else ""
        return QuotaExceeded(
            f"over quota ({what}): {detail}{hint}", detail=detail, retry_after_s=wait
        )
    if status == 401:
        message = (
            f"the sandcell service at {where} refused the API key ({detail}); pass the "
            "tenant's key (Client(url, api_key) or $SANDCELL_API_KEY; `sandcell tenants "
            "rotate-key NAME` makes a new one)"
        )
    elif errors:
        fields = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors)
        message = f"{what}: {detail} ({fields})"
    else:
        message = f"{what}: {detail}" if detail else f"{what}: the service answered {status}"
    return ServiceError(message, status=status, detail=detail, errors=errors)
