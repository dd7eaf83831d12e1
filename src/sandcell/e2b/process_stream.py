"""A process of the session as envd's ``ProcessEvent`` stream, read by polling its buffered
output (:meth:`Session.read_process`), and the session calls the process RPCs make.

The process lives in the session's kernel, not in the stream: the stream only reads what it
wrote, by offset, so a client that disconnects leaves it running and a later ``Connect`` reads it
again from the start of what is kept. Each read is a short cell of the session's process
manager; between empty reads the stream waits a little longer each time (up to
:data:`POLL_MAX_S`), and sends ``keepalive`` events while nothing comes.
"""

from __future__ import annotations

import asyncio
import base64
import signal as signals
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from sandcell.e2b.connect_rpc import STREAM_TYPE, end_of_stream, envelope
from sandcell.e2b.errors import E2BError, from_exception
from sandcell.e2b.registry import E2BSandbox
from sandcell.service.core import Service
from sandcell.sessions import ProcessNotFound, Session, SpawnFailed
from sandcell.sessions.processes import RING_BYTES, ProcessOutput

__all__ = ["POLL_MAX_S", "e2b_error", "end_message", "follow_process", "in_session", "streaming"]

POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5
"""The longest wait between two reads of a quiet process (output shows up at most this late)."""
T = TypeVar("T")


def e2b_error(exc: Exception, box: E2BSandbox) -> E2BError | None:
    """What a process call's failure is to the SDK."""
    if isinstance(exc, ProcessNotFound):
        return E2BError(404, str(exc), code="not_found")
    if isinstance(exc, SpawnFailed):
        return E2BError(400, str(exc), code="failed_precondition")
    if box.ended is not None:
        # Killed or timed out meanwhile: what the SDKs read as a sandbox that is gone.
        return E2BError(502, f"The sandbox {box.id} was not found", code="unavailable")
    return from_exception(exc)


async def in_session(service: Service, box: E2BSandbox, call: Callable[[Session], T]) -> T:
    """``call(session)`` on a session worker thread, its failure as the SDK reads it."""
    try:
        result: T = await service.in_thread(lambda: call(box.session), session=True)
    except Exception as exc:
        err = e2b_error(exc, box)
        if err is None:
            raise
        raise err from exc
    return result


def streaming(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` of a streaming RPC whose failure before its first message is the stream's
    end message, after a 200, as Connect streams report errors."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            err = from_exception(exc)
            if err is None:
                raise
            return Response(end_of_stream(err), media_type=STREAM_TYPE, headers=err.headers)

    return endpoint


def _data(field: str, raw: bytes) -> bytes:
    return envelope({"event": {"data": {field: base64.b64encode(raw).decode("ascii")}}})


def end_message(got: ProcessOutput) -> dict[str, Any]:
    """envd's ``end`` event of an exited process: its exit code (128 + N when signal N ended
    it, as Bash's ``$?`` reads)."""
    if got.signal is not None:
        code = 128 + got.signal
        try:
            name = signals.Signals(got.signal).name.removeprefix("SIG").lower()
        except ValueError:
            name = str(got.signal)
        status = f"signal: {name}"
    else:
        code = got.exit_code if got.exit_code is not None else 0
        status = f"exit status {code}"
    return {"exitCode": code, "exited": True, "status": status}


async def _read(
    service: Service, box: E2BSandbox, pid: int, out_at: int, err_at: int
) -> ProcessOutput:
    return await in_session(
        service, box, lambda s: s.read_process(pid, stdout_from=out_at, stderr_from=err_at)
    )


async def follow_process(
    service: Service,
    box: E2BSandbox,
    pid: int,
    *,
    pty: bool,
    keepalive_s: float,
    deadline: float | None,
    on_exit: Callable[[], object] | None = None,
) -> AsyncIterator[bytes]:
    """The data, keepalive and end events of process ``pid`` from the start of its kept output,
    then the end of the stream. ``deadline`` (monotonic) ends the stream with
    ``deadline_exceeded`` if the process has not exited by then; ``on_exit`` is called when
    the stream saw it exit."""
    out_at = err_at = 0
    pause = POLL_FIRST_S
    last_sent = time.monotonic()
    while True:
        got = None
        # While a cell runs, a read would hold a worker thread (shared by every sandbox) until
        # it ends: the stream waits here instead, with its keepalives.
        if not box.session.busy:
            try:
                got = await _read(service, box, pid, out_at, err_at)
            except E2BError as err:
                yield end_of_stream(err)
                return
        if got is not None:
            out_at, err_at = got.stdout_next, got.stderr_next
            for chunk in _chunks(got, pty=pty):
                yield chunk
                last_sent, pause = time.monotonic(), POLL_FIRST_S
            if got.exited and not got.more:
                if on_exit is not None:
                    on_exit()
                yield envelope({"event": {"end": end_message(got)}})
                yield end_of_stream()
                return
            if got.more:
                continue
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            yield end_of_stream(
                E2BError(504, f"process {pid} ran out of time (the request's timeout)")
            )
            return
        if now - last_sent >= keepalive_s:
            yield envelope({"event": {"keepalive": {}}})
            last_sent = now
        wait = pause if deadline is None else min(pause, max(deadline - now, 0.0))
        await asyncio.sleep(wait)
        pause = min(pause * 2, POLL_MAX_S)


def _chunks(got: ProcessOutput, *, pty: bool) -> list[bytes]:
    """The data events of one read; output the sandbox dropped before it was read is said
    where it was lost, on stderr (a terminal's own stream), never passed over in silence."""
    chunks = []
    for skipped, stream in ((got.stdout_skipped, "stdout"), (got.stderr_skipped, "stderr")):
        if skipped:
            note = (
                f"[sandcell: {skipped} bytes of this process's {stream} were dropped before "
                f"they were read (the sandbox keeps the last {RING_BYTES // 1024} KiB)]\n"
            )
            chunks.append(_data("pty" if pty else "stderr", note.encode()))
    if got.stdout:
        chunks.append(_data("pty" if pty else "stdout", got.stdout))
    if got.stderr:
        chunks.append(_data("stderr", got.stderr))
    return chunks
