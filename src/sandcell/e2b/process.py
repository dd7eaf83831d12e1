"""envd's ``process.Process`` streams: ``Start`` (``commands.run``, ``pty.create``) and
``Connect`` (``commands.connect``, ``pty.connect``).

Every command is a background process of the sandbox's session (:meth:`Session.spawn`): the SDK
sends the same ``Start`` for ``run(cmd)`` and ``run(cmd, background=True)`` and only waits on
the first, so each one is a process that outlives its stream, is listed while it runs, and can be
connected to, signalled and fed input from any client of the sandbox. Its stream opens with
``start`` and its pid, carries its output as ``data`` events (read from the session's buffers,
:mod:`sandcell.e2b.process_stream`), and ends with ``end`` and its exit code.

As in envd, the request's timeout (``Connect-Timeout-Ms``: the SDK's ``timeout``, 60 s unless
given, none for 0) is the process's: it is killed when it passes, whether or not a client still
reads it, and its stream ends with ``deadline_exceeded``. A client that disconnects leaves it
running. A command the profile denies, or one that needs approval (queued as a foreground one
is, :mod:`sandcell.e2b.approval`), starts nothing: the stream ends with ``permission_denied``
saying why. Each start is one run in the record and counts in the tenant's runs per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.approval import approval_sentence, ticket_for_policy
from sandcell.e2b.connect_rpc import STREAM_TYPE, envelope, read_message
from sandcell.e2b.errors import E2BError
from sandcell.e2b.paths import in_sandbox
from sandcell.e2b.process_control import chosen, process_control_routes
from sandcell.e2b.process_stream import e2b_error, follow_process, streaming
from sandcell.e2b.pty import pty_routes, pty_size
from sandcell.e2b.registry import E2BSandbox
from sandcell.e2b.runner import admit_cell
from sandcell.e2b.wire import ENV_NAME
from sandcell.service.core import Service
from sandcell.service.tenants import Tenant
from sandcell.sessions import SpawnFailed, SpawnRefused
from sandcell.sessions.processes import ProcessInfo

__all__ = ["command_of", "process_routes"]

_KEEPALIVE_S = 50.0
_BASH = ("/bin/bash", "bash", "/bin/sh", "sh")
# The timers that kill a process at its timeout, held so they are not collected meanwhile.
_TIMERS: set[asyncio.Task[None]] = set()


def program_of(process: Any) -> str | list[str]:
    """What a StartRequest's process runs: the Bash program X of ``bash -l -c X``, else the
    argv."""
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str):
        raise E2BError(400, "process.cmd: give the program to start")
    cmd = process["cmd"]
    args = process.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise E2BError(400, "process.args: give a list of strings")
    if not cmd:
        raise E2BError(400, "process.cmd: give the program to start")
    if cmd in _BASH and len(args) == 3 and args[:2] == ["-l", "-c"]:
        return str(args[2])
    return [cmd, *args]


def command_of(process: Any) -> str:
    """The command line a StartRequest's process runs, as the profile judges it."""
    program = program_of(process)
    return program if isinstance(program, str) else shlex.join(program)


def _timeout_s(request: Request) -> float | None:
    raw = request.headers.get("connect-timeout-ms")
    if raw is None or not raw.isdigit() or int(raw) == 0:
        return None
    return max(int(raw) / 1000.0, 0.001)


def _keepalive_s(request: Request) -> float:
    try:
        keepalive = float(request.headers.get("keepalive-ping-interval") or _KEEPALIVE_S)
    except ValueError:
        keepalive = _KEEPALIVE_S
    return max(keepalive, 1.0)


def _envs(process: dict[str, Any]) -> dict[str, str]:
    envs = process.get("envs") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and re.fullmatch(ENV_NAME, k) and isinstance(v, str)
        for k, v in envs.items()
    ):
        raise E2BError(
            400, "process.envs: give a map of variable names (letters, digits, _) to strings"
        )
    return {str(k): str(v) for k, v in envs.items()}


def _own(service: Service, tenant: Tenant, run_id: str | None) -> None:
    # The spawn's record is the tenant's, as a cell's is (its audit, its records).
    if run_id is not None:
        service.tenants.record_run(tenant.id, runs=[run_id], approvals=[], artifacts=[], cpu_ms=0)


def _refusal(service: Service, box: E2BSandbox, exc: SpawnRefused, command: str) -> E2BError:
    if exc.policy.get("verdict") != "approve":
        return E2BError(403, str(exc))
    ticket = ticket_for_policy(service, box, exc.policy, command, "bash")
    return E2BError(403, approval_sentence(ticket, exc.policy.get("reason") or str(exc)))


def _kill_at(service: Service, box: E2BSandbox, pid: int, after_s: float) -> asyncio.Task[None]:
    async def later() -> None:
        await asyncio.sleep(after_s)
        # Gone with its sandbox, or exited: nothing left to end.
        with contextlib.suppress(Exception):
            await service.in_thread(lambda: box.session.kill(pid), session=True)

    task = asyncio.ensure_future(later())
    _TIMERS.add(task)
    task.add_done_callback(_TIMERS.discard)
    return task


async def _spawn(
    service: Service, tenant: Tenant, box: E2BSandbox, message: dict[str, Any]
) -> ProcessInfo:
    process = message.get("process")
    program = program_of(process)
    assert isinstance(process, dict)
    size = pty_size(message.get("pty"))
    env = {**box.env, **_envs(process)}
    cwd_given = process.get("cwd")
    # Any directory of the sandbox, as E2B allows; the sandbox decides whether it may go there.
    cwd = in_sandbox(cwd_given, workspace=box.workspace) if cwd_given else box.workspace
    tag = message.get("tag") if isinstance(message.get("tag"), str) else None
    stdin = message.get("stdin") is True
    session = box.session
    try:
        info: ProcessInfo = await service.in_thread(
            lambda: session.spawn(program, env=env, cwd=cwd, stdin=stdin, pty=size, tag=tag),
            session=True,
        )
    except SpawnRefused as exc:
        _own(service, tenant, exc.run_id)
        raise _refusal(service, box, exc, command_of(process)) from exc
    except SpawnFailed as exc:
        _own(service, tenant, exc.run_id)
        raise E2BError(400, str(exc), code="failed_precondition") from exc
    except Exception as exc:
        err = e2b_error(exc, box)
        if err is None:
            raise
        raise err from exc
    _own(service, tenant, info.run_id)
    return info


async def start(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    tenant = admit_cell(service, box)
    info = await _spawn(service, tenant, box, message)
    timeout_s = _timeout_s(request)
    timer = None if timeout_s is None else _kill_at(service, box, info.pid, timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return StreamingResponse(
        _opened(
            service,
            box=box,
            info=info,
            keepalive_s=_keepalive_s(request),
            deadline=deadline,
            timer=timer,
        ),
        media_type=STREAM_TYPE,
    )


async def _opened(
    service: Service,
    *,
    box: E2BSandbox,
    info: ProcessInfo,
    keepalive_s: float,
    deadline: float | None,
    timer: asyncio.Task[None] | None = None,
) -> AsyncIterator[bytes]:
    yield envelope({"event": {"start": {"pid": info.pid}}})
    async for chunk in follow_process(
        service,
        box,
        info.pid,
        pty=info.pty is not None,
        keepalive_s=keepalive_s,
        deadline=deadline,
        on_exit=None if timer is None else timer.cancel,
    ):
        yield chunk


async def connect(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    info = await chosen(service, box, message.get("process"), exited_too=True)
    timeout_s = _timeout_s(request)
    # A connection's timeout bounds the stream only: the process keeps its own.
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return StreamingResponse(
        _opened(service, box=box, info=info, keepalive_s=_keepalive_s(request), deadline=deadline),
        media_type=STREAM_TYPE,
    )


def process_routes() -> list[Route]:
    p = "/process.Process"
    return [
        Route(f"{p}/Start", streaming(start), methods=["POST"]),
        Route(f"{p}/Connect", streaming(connect), methods=["POST"]),
        *process_control_routes(),
        *pty_routes(),
    ]
