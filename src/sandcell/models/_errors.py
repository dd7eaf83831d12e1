"""Turning a provider's HTTP failure into sandcell's ModelError, the same way for every provider.

The adapters catch their SDK's exceptions and hand the pieces (status, headers, body, URL) here,
so the agent sees one vocabulary: :class:`ModelRateLimited` with the provider's retry hint, a
retryable :class:`ModelError` for overloads, server errors and network trouble, and a plain
:class:`ModelError` for what retrying cannot fix (a bad key, an unknown model, a bad request).
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping

from sandcell.errors import ModelError, ModelRateLimited

# Statuses worth another try: timeout, conflict, rate limit, and every server-side failure.
_RETRYABLE_4XX = frozenset({408, 409, 429})
_DETAIL_CHARS = 300


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` (OpenAI) or ``retry-after`` (seconds or a date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = lowered.get(header)
        if raw is None:
            continue
        try:
            value = float(raw) / divisor
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def provider_detail(body: object) -> str:
    """The provider's own explanation from an error body, shortened; empty if it gave none."""
    detail: object = body
    if isinstance(detail, Mapping):
        inner = detail.get("error", detail)
        if isinstance(inner, Mapping):
            detail = inner.get("message", "")
        elif isinstance(inner, str):
            detail = inner
        else:
            detail = ""
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", errors="replace")
    if not isinstance(detail, str):
        return ""
    detail = " ".join(detail.split())
    if len(detail) > _DETAIL_CHARS:
        detail = detail[: _DETAIL_CHARS - 3] + "..."
    return detail


def status_error(
    *,
    provider: str,
    status: int,
    headers: Mapping[str, str],
    body: object,
    url: str,
    api_key_env: str | None,
) -> ModelError:
    """The ModelError for an HTTP error answer from ``provider`` at ``url``."""
    detail = provider_detail(body)
    said = f": {detail}" if detail else ""
    if status in (429, 529):
        retry_after = parse_retry_after(headers)
        why = "is rate limiting this key" if status == 429 else "is overloaded"
        hint = f"; it asks to retry after {retry_after:g} s" if retry_after is not None else ""
        return ModelRateLimited(
            f"{provider} {why} (HTTP {status}){said}{hint}",
            status=status,
            retry_after_s=retry_after,
        )
    if status in (401, 403):
        key = f"set {api_key_env} to a valid key" if api_key_env else "check the key passed in"
        what = "rejected the API key" if status == 401 else "refused this key access"
        return ModelError(f"{provider} {what} (HTTP {status}) at {url}{said}; {key}", status=status)
    if status == 404:
        return ModelError(
            f"{provider} answered 404 at {url}{said}; check the model name and the base URL "
            "(an OpenAI-compatible server usually wants a base URL ending in /v1)",
            status=status,
        )
    retryable = status >= 500 or status in _RETRYABLE_4XX
    kind = "failed on its side" if status >= 500 else "refused the request"
    return ModelError(
        f"{provider} {kind} (HTTP {status}) at {url}{said}", status=status, retryable=retryable
    )


def rejects_tools(status: int, body: object) -> bool:
    """Whether an error answer says the server cannot take the request's tools.

    Servers without tool calling refuse a request carrying ``tools`` as a bad request (400, or
    422 from validating frameworks) whose message names tools; any other failure is not that.
    """
    return status in (400, 422) and "tool" in provider_detail(body).lower()


def tools_refused(*, provider: str, url: str, status: int, body: object) -> ModelError:
    """The ModelError for a server that refused tool calling."""
    detail = provider_detail(body)
    return ModelError(
        f"{provider} at {url} refused tool calling (HTTP {status}): {detail}; use the "
        'plain-text protocol (--tool-calling text, or tool_calling = "text" in the [model] '
        "section of the config file), or auto to fall back by itself",
        status=status,
    )


def connection_error(*, provider: str, url: str, cause: BaseException | None) -> ModelError:
    """A retryable ModelError for a provider that could not be reached at all."""
    why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    return ModelError(
        f"cannot reach {provider} at {url}{why}; check that the server is running and the "
        "base URL is right",
        retryable=True,
    )


def timeout_error(*, provider: str, url: str, timeout_s: float) -> ModelError:
    """A retryable ModelError for a provider that did not answer within the timeout."""
    return ModelError(
        f"{provider} at {url} gave no answer within {timeout_s:g} s; retry, or raise the "
        "timeout (timeout_s in the [model] section of the config file)",
        retryable=True,
    )


def sdk_error(*, provider: str, url: str, exc: BaseException) -> ModelError:
    """A ModelError for any other failure the provider's SDK reports."""
    return ModelError(f"{provider} request to {url} failed: {type(exc).__name__}: {exc}")


def bad_response(*, provider: str, url: str, what: str) -> ModelError:
    """A ModelError for an answer that is not the provider's documented response shape."""
    return ModelError(
        f"{provider} at {url} sent a response sandcell cannot read ({what}); check that the base "
        "URL points at a server speaking this provider's API",
        retryable=False,
    )


__all__ = [
    "bad_response",
    "connection_error",
    "parse_retry_after",
    "provider_detail",
    "rejects_tools",
    "sdk_error",
    "status_error",
    "timeout_error",
    "tools_refused",
]
