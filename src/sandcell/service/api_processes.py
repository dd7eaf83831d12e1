"""``/v1/sessions/{id}/processes`` and ``/v1/sessions/{id}/watches``: a live session's
background processes, terminals and directory watches (:mod:`sandcell.sessions.processes`).

A spawn is admitted by the session's profile as a Bash cell is, counts in the tenant's runs per
minute, and is one run in the record, the tenant's as a cell's is (``/v1/audit``): also when it
was refused (403) or could not start (422). Reads, input, signals and watches are sandcell's own
operations on the session: no runs. Another tenant's session, and a process or watch the
session does not have, are 404. Output is read by byte offset (reading does not consume), as
JSON with base64 bytes, or followed as Server-Sent Events until the process has exited and all
it wrote was sent.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse

from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.api_sessions import _live
from sandcell.service.cell_stream import sse
from sandcell.service.core import LiveSession, Service
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.process_models import (
    ProcessBody,
    ProcessOutputBody,
    ResizeBody,
    SignalBody,
    SpawnBody,
    StdinBody,
    WatchBody,
    WatchCreatedBody,
    WatchEventBody,
)
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.sessions.processes import FOLLOW_PAUSE_S, ProcessOutput, SpawnFailed, SpawnRefused
from sandcell.wire import error_wire, public_message, title

__all__ = ["router"]

log = logging.getLogger("sandcell.service")
router = APIRouter(prefix="/v1/sessions", tags=["session processes"])
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
KEEPALIVE_S = 15.0
"""A followed process that writes nothing for this long gets a comment line, so that proxies
between the service and the client keep the stream open."""
Offset = Annotated[int, Query(ge=0, description="a byte offset in the stream")]
_NO_CONTENT: dict[int | str, dict[str, Any]] = {204: {"description": "done"}, **_PROBLEMS}


async def _on(service: Service, live: LiveSession, call: Callable[[Session], T]) -> T:
    """``call(session)`` on a session worker thread; a session that ended meanwhile (its
    lifetime) gives back its slot."""
    try:
        result: T = await service.in_thread(lambda: call(live.session), session=True)
    finally:
        if live.session.ended is not None:
            service.end_session(live)
    return result


def _no_content(method: str, path: str) -> Callable[[F], F]:
    """A route that answers 204 with no body once done."""
    return router.api_route(
        path, methods=[method], status_code=204, response_class=Response, responses=_NO_CONTENT
    )


async def _done(
    service: Service, tenant: Tenant, session_id: str, call: Callable[[Session], object]
) -> Response:
    """``call`` on the tenant's live session, answered with 204."""
    await _on(service, _live(service, tenant, session_id), call)
    return Response(status_code=204)


def _own(service: Service, tenant: Tenant, run_id: str | None) -> None:
    # The spawn's record is the tenant's, as a cell's is (its audit, its records).
    if run_id is not None:
        service.tenants.record_run(tenant.id, runs=[run_id], approvals=[], artifacts=[], cpu_ms=0)


@router.post(
    "/{session_id}/processes", response_model=ProcessBody, status_code=201, responses=_PROBLEMS
)
async def spawn_process(
    session_id: str, body: SpawnBody, service: ServiceDep, tenant: CurrentTenant
) -> ProcessBody:
    """Start a command in the background in the session's sandbox and answer at once with its
    pid (cells go on meanwhile). 403 when the profile does not admit it (denied, or it needs a
    person's approval, which a session cannot wait for); 422 when it did not start (the
    session's process limit, no such program). Either way it is a run in the record."""
    live = _live(service, tenant, session_id)
    cmd = body.cmd
    service.check_code(cmd if isinstance(cmd, str) else shlex.join(cmd))
    service.admit(tenant, sandbox=False)
    size = None if body.pty is None else (body.pty.rows, body.pty.cols)
    try:
        info = await _on(
            service,
            live,
            lambda s: s.spawn(
                cmd, env=body.env, cwd=body.cwd, stdin=body.stdin, pty=size, tag=body.tag
            ),
        )
    except (SpawnRefused, SpawnFailed) as exc:
        _own(service, tenant, exc.run_id)
        raise
    _own(service, tenant, info.run_id)
    return ProcessBody.of(info)


@router.get("/{session_id}/processes", response_model=list[ProcessBody], responses=_PROBLEMS)
async def list_processes(
    session_id: str, service: ServiceDep, tenant: CurrentTenant
) -> list[ProcessBody]:
    """Every process started in the session's kernel, running or exited, oldest first (a
    files-mode resume starts a fresh kernel, with none)."""
    live = _live(service, tenant, session_id)
    found = await _on(service, live, lambda s: s.processes())
    return [ProcessBody.of(p) for p in found]


@router.get(
    "/{session_id}/processes/{pid}/output",
    response_model=ProcessOutputBody,
    responses=_PROBLEMS,
)
async def read_output(
    session_id: str,
    pid: int,
    service: ServiceDep,
    tenant: CurrentTenant,
    *,
    stdout_from: Offset = 0,
    stderr_from: Offset = 0,
) -> ProcessOutputBody:
    """The process's output from these byte offsets (at most 128 KiB per stream, less under a
    small stdout cap; ``more`` says there is more), and whether it exited."""
    live = _live(service, tenant, session_id)
    got = await _on(
        service,
        live,
        lambda s: s.read_process(pid, stdout_from=stdout_from, stderr_from=stderr_from),
    )
    return ProcessOutputBody.of(got)


@router.get(
    "/{session_id}/processes/{pid}/output/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **_PROBLEMS},
    response_class=StreamingResponse,
)
async def follow_output(
    session_id: str,
    pid: int,
    service: ServiceDep,
    tenant: CurrentTenant,
    *,
    stdout_from: Offset = 0,
    stderr_from: Offset = 0,
) -> StreamingResponse:
    """The process's output as Server-Sent Events, from these offsets: an ``output`` event
    for each read with new bytes (the body of ``.../output``), then ``exit`` (the last read,
    once the process has exited and all it wrote was sent) or ``error`` (a problem document:
    the session ended meanwhile); the stream ends after it. No such session or process is an
    ordinary 404 before the stream starts. While a cell runs the stream waits (with its
    keep-alive comments) rather than read. A client that leaves stops only the following: the
    process runs on."""
    live = _live(service, tenant, session_id)

    def read(out_from: int, err_from: int) -> Callable[[Session], ProcessOutput]:
        return lambda s: s.read_process(pid, stdout_from=out_from, stderr_from=err_from)

    first = await _on(service, live, read(stdout_from, stderr_from))

    async def events() -> AsyncIterator[bytes]:
        got, sent_at = first, time.monotonic()
        while True:
            done = got.exited and not got.more
            if done or got.stdout or got.stderr or got.stdout_skipped or got.stderr_skipped:
                body = ProcessOutputBody.of(got).model_dump(mode="json")
                yield sse("exit" if done else "output", body)
                sent_at = time.monotonic()
                if done:
                    return
            elif time.monotonic() - sent_at >= KEEPALIVE_S:
                yield b": keep-alive\n\n"
                sent_at = time.monotonic()
            if not got.more:
                await asyncio.sleep(FOLLOW_PAUSE_S)
            while live.session.busy:
                # A cell runs: a read now would hold one of the service's shared session
                # threads until it ends. The output is buffered meanwhile.
                if time.monotonic() - sent_at >= KEEPALIVE_S:
                    yield b": keep-alive\n\n"
                    sent_at = time.monotonic()
                await asyncio.sleep(FOLLOW_PAUSE_S)
            try:
                got = await _on(service, live, read(got.stdout_next, got.stderr_next))
            except Exception as exc:
                yield sse("error", _problem(exc))
                return

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _problem(exc: BaseException) -> dict[str, object]:
    """The problem document the service would have answered with, had the stream not begun."""
    row = error_wire(exc)
    if not row.public:
        log.error("following a session's process failed", exc_info=exc)
    status = row.http_status
    return {"type": "about:blank", "title": title(status), "status": status,
            "detail": public_message(exc, row)}  # fmt: skip


@_no_content("POST", "/{session_id}/processes/{pid}/stdin")
async def send_stdin(
    session_id: str, pid: int, body: StdinBody, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """Queue input for the process (its terminal's, for a PTY); written as it reads. 422 for a
    process without open input."""
    live = _live(service, tenant, session_id)
    data = body.data()
    await _on(service, live, lambda s: s.send_stdin(pid, data))
    return Response(status_code=204)


@_no_content("POST", "/{session_id}/processes/{pid}/stdin/close")
async def close_stdin(
    session_id: str, pid: int, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """End the process's input once what was queued is written (a terminal gets ^D)."""
    return await _done(service, tenant, session_id, lambda s: s.close_stdin(pid))


@_no_content("POST", "/{session_id}/processes/{pid}/signal")
async def signal_process(
    session_id: str, pid: int, body: SignalBody, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """Send a signal to the process and its process group; an exited process is left alone."""
    number = int(body.signal)
    return await _done(service, tenant, session_id, lambda s: s.signal(pid, number))


@_no_content("DELETE", "/{session_id}/processes/{pid}")
async def kill_process(
    session_id: str, pid: int, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """SIGKILL to the process and its group (it stays listed, exited, with its output)."""
    return await _done(service, tenant, session_id, lambda s: s.kill(pid))


@_no_content("POST", "/{session_id}/processes/{pid}/resize")
async def resize_terminal(
    session_id: str, pid: int, body: ResizeBody, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """Set the size of the process's terminal (it gets SIGWINCH); 422 without a terminal."""
    return await _done(service, tenant, session_id, lambda s: s.resize(pid, body.rows, body.cols))


@router.post(
    "/{session_id}/watches", response_model=WatchCreatedBody, status_code=201, responses=_PROBLEMS
)
async def add_watch(
    session_id: str, body: WatchBody, service: ServiceDep, tenant: CurrentTenant
) -> WatchCreatedBody:
    """Watch a directory of the sandbox for created, written, removed and renamed entries
    (its subdirectories too when ``recursive``). 404 when it is not a directory."""
    live = _live(service, tenant, session_id)
    watch_id = await _on(service, live, lambda s: s.watch(body.path, recursive=body.recursive))
    return WatchCreatedBody(id=watch_id, path=body.path, recursive=body.recursive)


@router.get(
    "/{session_id}/watches/{watch_id}/events",
    response_model=list[WatchEventBody],
    responses=_PROBLEMS,
)
async def watch_events(
    session_id: str, watch_id: int, service: ServiceDep, tenant: CurrentTenant
) -> list[WatchEventBody]:
    """The changes seen since the last call, oldest first (each is answered once; at most
    10,000 are kept between calls)."""
    live = _live(service, tenant, session_id)
    found = await _on(service, live, lambda s: s.watch_events(watch_id))
    return [WatchEventBody.of(e) for e in found]


@_no_content("DELETE", "/{session_id}/watches/{watch_id}")
async def remove_watch(
    session_id: str, watch_id: int, service: ServiceDep, tenant: CurrentTenant
) -> Response:
    """Stop the watch."""
    return await _done(service, tenant, session_id, lambda s: s.unwatch(watch_id))
