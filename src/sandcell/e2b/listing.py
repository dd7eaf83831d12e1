"""``Sandbox.list``: which of a tenant's sandboxes (running and paused) a query names, in which
order, a page at a time.

The query is E2B's (``metadata``, ``state``, ``startedAfter``, ``template``, ``order``,
``limit``, ``nextToken``). A page's token is a cursor, the start time and id of its last
sandbox, as on E2B: the next page goes on after that sandbox, so a sandbox that ends between
two pages does not shift the others into the page already read (an offset would skip one).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sandcell.e2b.errors import E2BError

__all__ = ["ListQuery", "Listed", "merge_pages", "page_limit"]

_PAGE = 100
_MAX_PAGE = 1000
_STATES = frozenset({"running", "paused"})


def _metadata(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    # The SDK quotes each key and value and then url-encodes the pairs: undo both.
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def _when(raw: str | None) -> dt.datetime | None:
    if not raw:
        return None
    try:
        when = dt.datetime.fromisoformat(raw.replace(" ", "+"))
    except ValueError:
        raise E2BError(
            400, f"startedAfter {raw!r}: give an ISO 8601 time, e.g. 2026-01-31T12:00:00Z"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


class Listed(Protocol):
    """A sandbox as a listing sees it: a running one (:class:`~sandcell.e2b.registry.
    E2BSandbox`) or a paused one (:class:`~sandcell.e2b.paused.PausedSandbox`)."""

    @property
    def id(self) -> str: ...
    @property
    def template(self) -> str: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...
    @property
    def started_at(self) -> dt.datetime: ...
    @property
    def state(self) -> str: ...


L = TypeVar("L", bound=Listed)


def _key(box: Listed) -> tuple[dt.datetime, str]:
    return (box.started_at, box.id)


def _token(box: Listed) -> str:
    return _token_of(box.started_at, box.id)


def _token_of(started_at: dt.datetime, sandbox_id: str) -> str:
    text = f"{started_at.isoformat()}|{sandbox_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _cursor(raw: str | None) -> tuple[dt.datetime, str] | None:
    if not raw:
        return None
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
        when, _, sandbox_id = text.partition("|")
        started = dt.datetime.fromisoformat(when)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise E2BError(
            400, "nextToken: give the x-next-token of the previous page, unchanged"
        ) from None
    if not sandbox_id or started.tzinfo is None:
        raise E2BError(400, "nextToken: give the x-next-token of the previous page, unchanged")
    return (started, sandbox_id)


def page_limit(params: Mapping[str, str]) -> int:
    """The page size a listing's ``limit`` asks for (default :data:`_PAGE`), or a 400."""
    try:
        limit = int(params.get("limit") or _PAGE)
    except ValueError:
        raise E2BError(400, "limit: give a whole number") from None
    if not 1 <= limit <= _MAX_PAGE:
        raise E2BError(400, f"limit: give a number from 1 to {_MAX_PAGE}")
    return limit


@dataclass(frozen=True, slots=True, kw_only=True)
class ListQuery:
    """One ``GET /v2/sandboxes`` query."""

    metadata: dict[str, str]
    """Every pair must be in the sandbox's metadata; empty: no filter."""
    states: frozenset[str]
    """``running`` and/or ``paused`` (both when the query names neither, as on E2B)."""
    started_after: dt.datetime | None
    """Only sandboxes started at or after it."""
    template: str | None
    """Only sandboxes created with this template (as given to ``create``)."""
    descending: bool
    """Newest first (``order=desc``); oldest first otherwise, the default."""
    limit: int
    after: tuple[dt.datetime, str] | None
    """The previous page's last sandbox (start time, id): this page goes on after it."""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> ListQuery:
        """The query of ``params``, or a 400 naming the parameter that is wrong."""
        states = frozenset(s for s in (params.get("state") or "").split(",") if s) or _STATES
        if not states <= _STATES:
            raise E2BError(400, f"state: give running and/or paused, not {sorted(states)}")
        order = (params.get("order") or "asc").lower()
        if order not in ("asc", "desc"):
            raise E2BError(400, f"order {order!r}: give asc or desc")
        limit = page_limit(params)
        return cls(
            metadata=_metadata(params.get("metadata")),
            states=states,
            started_after=_when(params.get("startedAfter")),
            template=params.get("template") or None,
            descending=order == "desc",
            limit=limit,
            after=_cursor(params.get("nextToken")),
        )

    def matches(self, box: Listed) -> bool:
        return (
            box.state in self.states
            and all(box.metadata.get(k) == v for k, v in self.metadata.items())
            and (self.started_after is None or box.started_at >= self.started_after)
            and (self.template is None or box.template == self.template)
        )

    def page(self, boxes: Sequence[L]) -> tuple[list[L], str | None]:
        """This query's page of ``boxes`` (the ones it matches) and the next page's token
        (None: this is the last page)."""
        ordered = sorted(boxes, key=_key, reverse=self.descending)
        if self.after is not None:
            after = self.after
            ordered = [
                b for b in ordered if (_key(b) < after if self.descending else _key(b) > after)
            ]
        page = ordered[: self.limit]
        return page, (_token(page[-1]) if len(ordered) > self.limit else None)


def _shown_key(shown: Mapping[str, Any]) -> tuple[dt.datetime, str]:
    return (dt.datetime.fromisoformat(str(shown["startedAt"])), str(shown["sandboxID"]))


def merge_pages(
    params: Mapping[str, str], pages: Sequence[tuple[Sequence[Mapping[str, Any]], str | None]]
) -> tuple[list[Mapping[str, Any]], str | None]:
    """One page of the same query answered by several replicas (each its own sandboxes, as
    shown on the wire, and its next page's token), as one replica holding them all would
    answer it. The cursor is a position in the order of every sandbox, not of one replica's,
    so each replica's page starts where the merged page does: the merged page is the first
    ``limit`` of their union, and there is a next page when that union or any replica has
    more. A sandbox two replicas show (a paused one, stored in the shared directory) is
    shown once."""
    query = ListQuery.of(params)
    seen: dict[str, Mapping[str, Any]] = {}
    more = False
    for shown, token in pages:
        more = more or token is not None
        for box in shown:
            seen.setdefault(str(box["sandboxID"]), box)
    ordered = sorted(seen.values(), key=_shown_key, reverse=query.descending)
    page = ordered[: query.limit]
    if page and (more or len(ordered) > query.limit):
        return page, _token_of(*_shown_key(page[-1]))
    return page, None
