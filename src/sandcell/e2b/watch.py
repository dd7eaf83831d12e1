"""envd's directory watches: ``WatchDir`` (a stream; the async SDK's ``files.watch_dir``) and
``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher`` (the sync SDK's ``WatchHandle``).

A watch is the session's (:meth:`Session.watch`): inotify inside the sandbox, so it sees what
any command, cell or file call changed there. Its events keep the manager's names relative to
the watched directory and map one to one onto E2B's types (create, write, remove, rename,
chmod). ``include_entry`` is not served: events come without their entry (the SDK's ``entry``
is then None). A ``WatchDir`` stream polls the watch (up to :data:`POLL_MAX_S` apart), sends
``keepalive`` events while nothing happens, and removes the watch when the client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.connect_rpc import STREAM_TYPE, end_of_stream, envelope, read_message, unary
from sandcell.e2b.errors import E2BError
from sandcell.e2b.paths import in_sandbox
from sandcell.e2b.process_stream import POLL_MAX_S, in_session, streaming
from sandcell.e2b.registry import E2BSandbox
from sandcell.service.core import Service
from sandcell.sessions.processes import WatchEvent

__all__ = ["watch_routes"]

_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
_KEEPALIVE_S = 50.0
# Removals of watches whose stream ended, held so they are not collected meanwhile.
_REMOVING: set[asyncio.Future[Any]] = set()


def _events(found: list[WatchEvent]) -> list[dict[str, str]]:
    return [{"name": e.name, "type": _TYPES[e.type]} for e in found if e.type in _TYPES]


async def _start_watch(request: Request) -> tuple[Service, E2BSandbox, int]:
    box = sandbox_of(request)
    service = service_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    path = message.get("path")
    if not isinstance(path, str):
        raise E2BError(400, "path: give the directory to watch")
    full = in_sandbox(path, workspace=box.workspace)
    recursive = message.get("recursive") is True
    watch_id = await in_session(service, box, lambda s: s.watch(full, recursive=recursive))
    return service, box, watch_id


def _watcher_id(message: dict[str, Any]) -> int:
    raw = message.get("watcherId", message.get("watcher_id"))
    if not isinstance(raw, str) or not raw.isdigit():
        raise E2BError(404, f"no watcher {raw!r} in this sandbox", code="not_found")
    return int(raw)


async def create_watcher(request: Request) -> Response:
    _, _, watch_id = await _start_watch(request)
    return unary({"watcherId": str(watch_id)})


async def get_watcher_events(request: Request) -> Response:
    box = sandbox_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    watch_id = _watcher_id(message)
    found = await in_session(service_of(request), box, lambda s: s.watch_events(watch_id))
    return unary({"events": _events(found)})


async def remove_watcher(request: Request) -> Response:
    box = sandbox_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    watch_id = _watcher_id(message)
    await in_session(service_of(request), box, lambda s: s.unwatch(watch_id))
    return unary({})


def _timeout_s(request: Request) -> float | None:
    raw = request.headers.get("connect-timeout-ms")
    if raw is None or not raw.isdigit() or int(raw) == 0:
        return None
    return int(raw) / 1000.0


async def watch_dir(request: Request) -> Response:
    try:
        keepalive = float(request.headers.get("keepalive-ping-interval") or _KEEPALIVE_S)
    except ValueError:
        keepalive = _KEEPALIVE_S
    timeout_s = _timeout_s(request)
    service, box, watch_id = await _start_watch(request)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return StreamingResponse(
        _watching(service, box, watch_id, max(keepalive, 1.0), deadline), media_type=STREAM_TYPE
    )


async def _watching(
    service: Service, box: E2BSandbox, watch_id: int, keepalive_s: float, deadline: float | None
) -> AsyncIterator[bytes]:
    try:
        yield envelope({"start": {}})
        last_sent, pause = time.monotonic(), 0.05
        while True:
            found = []
            # Not while a cell runs: the read would hold a shared worker thread until it ends.
            if not box.session.busy:
                try:
                    found = await in_session(service, box, lambda s: s.watch_events(watch_id))
                except E2BError as err:
                    yield end_of_stream(err)
                    return
            for event in _events(found):
                yield envelope({"filesystem": event})
            now = time.monotonic()
            if found:
                last_sent, pause = now, 0.05
            elif now - last_sent >= keepalive_s:
                yield envelope({"keepalive": {}})
                last_sent = now
            if deadline is not None and now >= deadline:
                yield end_of_stream(E2BError(504, "the watch ran out of time (its timeout)"))
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)
    finally:
        # The client may be gone (this generator cancelled): the removal must not wait on it.
        removal = asyncio.ensure_future(_unwatch(service, box, watch_id))
        _REMOVING.add(removal)
        removal.add_done_callback(_REMOVING.discard)


async def _unwatch(service: Service, box: E2BSandbox, watch_id: int) -> None:
    # A sandbox that ended took its watches with it.
    with contextlib.suppress(Exception):
        await service.in_thread(lambda: box.session.unwatch(watch_id), session=True)


def watch_routes() -> list[Route]:
    fs = "/filesystem.Filesystem"
    return [
        Route(f"{fs}/WatchDir", streaming(watch_dir), methods=["POST"]),
        Route(f"{fs}/CreateWatcher", create_watcher, methods=["POST"]),
        Route(f"{fs}/GetWatcherEvents", get_watcher_events, methods=["POST"]),
        Route(f"{fs}/RemoveWatcher", remove_watcher, methods=["POST"]),
    ]
