"""One page of a listing, and the bounds every paged listing of the service keeps.

A page is at most :data:`MAX_LIMIT` items, and building it looks at no more than
:data:`MAX_SCAN` stored rows, however many a tenant has: a listing is cheap and of a bounded
cost on every request, and the client follows ``next_cursor`` (sent as the
``X-Next-Cursor`` header) for more. A cursor is the id of the last row looked at, opaque to
the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastapi import Response

__all__ = ["MAX_LIMIT", "MAX_SCAN", "NEXT_CURSOR", "Page", "send_cursor"]

_T = TypeVar("_T")

MAX_LIMIT = 500
"""The most items one page may ask for (``limit``)."""
MAX_SCAN = 2000
"""The most stored rows one page looks at; a page may be short and still have a cursor."""
NEXT_CURSOR = "X-Next-Cursor"


@dataclass(frozen=True, slots=True)
class Page(Generic[_T]):
    items: Sequence[_T]
    next_cursor: str | None
    """Where the next page starts; None when there is nothing more."""


def send_cursor(response: Response, page: Page[_T], path: str) -> None:
    """Tell the client where the next page starts (header and ``Link``), if there is one."""
    if page.next_cursor is not None:
        response.headers[NEXT_CURSOR] = page.next_cursor
        response.headers["Link"] = f'<{path}cursor={page.next_cursor}>; rel="next"'
