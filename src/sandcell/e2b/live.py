"""A run's output as it happens: what the worker thread prints, handed to an async stream.

:func:`follow` starts a run with a listener that queues each ``(stream, text)`` on the event
loop, and yields them as they come, ``None`` every ``keepalive_s`` while nothing does, and the
run's result (or the exception it raised) last.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from sandcell.e2b.runner import OutputListener
from sandcell.spec import RunResult

__all__ = ["Done", "follow"]


class Done:
    """The end of a followed run: its result, or what it raised."""

    def __init__(self, result: RunResult | None, error: BaseException | None) -> None:
        self.result = result
        self.error = error


async def follow(
    start: Callable[[OutputListener], Awaitable[RunResult]], *, keepalive_s: float | None = None
) -> AsyncIterator[tuple[str, str] | Done | None]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def listener(stream: str, text: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (stream, text))

    task = asyncio.ensure_future(start(listener))
    try:
        while not task.done():
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                {getter, task}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
            )
            if getter in done:
                yield getter.result()
                continue
            getter.cancel()
            if not done:
                yield None
        # The listener's last calls were queued on the loop before the result was.
        await asyncio.sleep(0)
        while not queue.empty():
            yield queue.get_nowait()
        error = task.exception()
        yield Done(None if error is not None else task.result(), error)
    finally:
        if not task.done():
            # The client went away: the run finishes on its thread and is recorded all the same.
            task.add_done_callback(lambda t: t.exception())
