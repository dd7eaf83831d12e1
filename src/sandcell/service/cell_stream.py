"""A session cell answered as Server-Sent Events: its output while it runs, then its result.

Used by ``POST /v1/sessions/{id}/cells/stream`` (``api_sessions.py``). The cell runs as any
other (:func:`~sandcell.service.api_sessions._cell`: checks, quota, record); the listener it is
given hops each piece of output from the run's delivery thread onto the event loop, into a
queue this response drains. Everything the cell printed is queued before its result is
(:meth:`sandcell.live_output.LiveOutput.close` runs before the cell returns), so the ``result``
event always comes last.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from sandcell.errors import ConfigError, InfraError, IsolationUnavailable
from sandcell.live_output import OutputListener
from sandcell.service.models import ResultBody
from sandcell.service.problems import ServiceProblem
from sandcell.sessions import SessionEnded
from sandcell.spec import RunResult, result_to_dict

__all__ = ["cell_events", "sse"]

log = logging.getLogger("sandcell.service")

CellCall = Callable[[OutputListener], Coroutine[Any, Any, RunResult]]


def sse(kind: str, data: object) -> bytes:
    """One Server-Sent Event."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def cell_events(run: CellCall, *, on_gone: Callable[[], object]) -> AsyncIterator[bytes]:
    """Start the cell (``run(on_output)``) and return its event stream.

    A refusal before the cell starts (the checks and the quota, which ``run`` does before its
    first wait) is raised here, so that it is an ordinary problem response; a failure after
    that is an ``error`` event. ``on_gone`` is called when the client leaves before the end
    (it cancels the cell, which still ends and is recorded).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, dict[str, object]]] = asyncio.Queue()

    def on_output(stream: str, text: str) -> None:
        event: tuple[str, dict[str, object]] = (stream, {"text": text})
        loop.call_soon_threadsafe(queue.put_nowait, event)

    work = asyncio.ensure_future(run(on_output))
    # The cell's own checks run in its first step, before it waits for the sandbox.
    await asyncio.sleep(0)
    refused = work.exception() if work.done() else None
    if refused is not None:
        raise refused
    # A stream the client left is not awaited: its failure is retrieved here, not logged as
    # "never retrieved".
    work.add_done_callback(lambda t: t.cancelled() or t.exception())
    return _events(work, queue, on_gone)


async def _events(
    work: asyncio.Future[RunResult],
    queue: asyncio.Queue[tuple[str, dict[str, object]]],
    on_gone: Callable[[], object],
) -> AsyncIterator[bytes]:
    try:
        while True:
            get = asyncio.ensure_future(queue.get())
            waiting: set[asyncio.Future[Any]] = {get, work}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if get.done():
                kind, data = get.result()
                yield sse(kind, data)
                continue
            get.cancel()
            while not queue.empty():
                kind, data = queue.get_nowait()
                yield sse(kind, data)
            exc = work.exception()
            if exc is None:
                body = ResultBody.model_validate(result_to_dict(work.result()))
                yield sse("result", body.model_dump(mode="json"))
            else:
                yield sse("error", _problem(exc))
            return
    finally:
        if not work.done():
            on_gone()


def _problem(exc: BaseException) -> dict[str, object]:
    """The problem document the service would have answered with, had the stream not begun."""
    if isinstance(exc, ServiceProblem):
        status, detail = exc.status, exc.detail
    elif isinstance(exc, SessionEnded):
        status, detail = 409, str(exc)
    elif isinstance(exc, IsolationUnavailable | InfraError):
        status, detail = 503, str(exc)
    elif isinstance(exc, ConfigError):
        status, detail = 400, str(exc)
    else:
        log.error("a streamed cell failed", exc_info=exc)
        status, detail = 500, "the service failed to answer; its log has the details"
    return {"type": "about:blank", "status": status, "detail": detail}
