"""envd's ``process.Process``: ``Start`` (what ``commands.run`` calls) as a Connect stream.

The command runs as Bash in the sandbox (:mod:`sandcell.e2b.shell`), in the foreground: the
stream opens with ``start``, carries the output as ``data`` events (live when the session offers
it), ``keepalive`` events while nothing comes, and ends with ``end`` and the exit code. A denied
command, or one that needs approval, ends the stream with ``permission_denied`` saying why; one
over its time limit with ``deadline_exceeded``. Background processes are not served: nothing
outlives its command, so ``List`` is empty and ``Connect``, ``SendSignal``, ``SendInput``
answer ``not_found``.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.approval import approval_message, needs_approval, ticket_for
from sandcell.e2b.connect_rpc import STREAM_TYPE, end_of_stream, envelope, read_message, unary
from sandcell.e2b.errors import E2BError, from_exception
from sandcell.e2b.live import Done, follow
from sandcell.e2b.paths import in_sandbox
from sandcell.e2b.registry import E2BSandbox
from sandcell.e2b.runner import OutputListener, admit_cell, run_in_sandbox
from sandcell.e2b.shell import run_bash
from sandcell.e2b.wire import ENV_NAME
from sandcell.service.core import Service
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import Outcome, RunResult
from sandcell.wire import outcome_wire

__all__ = ["process_routes"]

_KEEPALIVE_S = 50.0


def command_of(process: Any) -> str:
    """The Bash program of a StartRequest's process: ``bash -l -c X`` is X, anything else the
    quoted command line."""
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str):
        raise E2BError(400, "process.cmd: give the program to start")
    cmd = process["cmd"]
    args = process.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise E2BError(400, "process.args: give a list of strings")
    if (
        cmd in ("/bin/bash", "bash", "/bin/sh", "sh")
        and len(args) == 3
        and args[:2]
        == [
            "-l",
            "-c",
        ]
    ):
        return str(args[2])
    return shlex.join([cmd, *args])


def _timeout_s(request: Request) -> float | None:
    raw = request.headers.get("connect-timeout-ms")
    if raw is None or not raw.isdigit():
        return None
    return max(int(raw) / 1000.0, 0.001)


def _data(stream: str, text: str) -> bytes:
    encoded = base64.b64encode(text.encode("utf-8", errors="surrogateescape")).decode()
    return envelope({"event": {"data": {stream: encoded}}})


async def _events(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    command: str,
    *,
    env: dict[str, str],
    cwd: str,
    timeout_s: float | None,
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    yield envelope({"event": {"start": {"pid": next(box.pids)}}})

    def start(listener: OutputListener) -> Any:
        def call(session: Session, extra: dict[str, Any]) -> RunResult:
            return run_bash(
                session,
                command,
                env=env,
                cwd=cwd,
                timeout_s=timeout_s,
                on_output=extra.get("on_output"),
            )

        return run_in_sandbox(service, tenant, box, call, on_output=listener)

    async for item in follow(start, keepalive_s=keepalive_s):
        if item is None:
            yield envelope({"event": {"keepalive": {}}})
        elif isinstance(item, tuple):
            yield _data(*item)
        else:
            for chunk in _ending(service, box, command, item):
                yield chunk


def _ending(service: Service, box: E2BSandbox, command: str, done: Done) -> list[bytes]:
    if done.error is not None or done.result is None:
        err = from_exception(done.error) if isinstance(done.error, Exception) else None
        return [end_of_stream(err or E2BError(500, "the command could not be run"))]
    result = done.result
    out: list[bytes] = []  # the output itself went out live, as it was printed
    if needs_approval(result):
        ticket = ticket_for(service, box, result, command, "bash")
        return [*out, end_of_stream(E2BError(403, approval_message(ticket, result)))]
    refused = outcome_wire(result.outcome).e2b_status  # denied 403, timeout 504
    if refused is not None:
        said = "the command ran out of time: " if result.outcome is Outcome.TIMEOUT else ""
        return [*out, end_of_stream(E2BError(refused, said + result.reason))]
    code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 9)
    end: dict[str, Any] = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    if result.outcome not in (Outcome.OK, Outcome.ERROR):
        end["error"] = result.reason
    return [*out, envelope({"event": {"end": end}}), end_of_stream()]


async def start(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    if message.get("pty"):
        raise E2BError(400, "PTY sessions are not served by sandcell; run commands without one")
    process = message.get("process")
    command = command_of(process)
    assert isinstance(process, dict)
    envs = process.get("envs") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and re.fullmatch(ENV_NAME, k) and isinstance(v, str)
        for k, v in envs.items()
    ):
        raise E2BError(
            400, "process.envs: give a map of variable names (letters, digits, _) to strings"
        )
    cwd_given = process.get("cwd")
    # Any directory of the sandbox, as E2B allows; the sandbox decides whether it may go there.
    cwd = in_sandbox(cwd_given, workspace=box.workspace) if cwd_given else box.workspace
    tenant = admit_cell(service, box)
    try:
        keepalive = float(request.headers.get("keepalive-ping-interval") or _KEEPALIVE_S)
    except ValueError:
        keepalive = _KEEPALIVE_S
    events = _events(
        service,
        tenant,
        box,
        command,
        env={**box.env, **{str(k): str(v) for k, v in envs.items()}},
        cwd=cwd,
        timeout_s=_timeout_s(request),
        keepalive_s=max(keepalive, 1.0),
    )
    return StreamingResponse(events, media_type=STREAM_TYPE)


async def list_processes(request: Request) -> Response:
    sandbox_of(request)
    return unary({"processes": []})


async def no_such_process(request: Request) -> Response:
    sandbox_of(request)
    raise E2BError(
        404, "no such process: sandcell runs commands in the foreground only", code="not_found"
    )


def process_routes() -> list[Route]:
    p = "/process.Process"
    routes = [
        Route(f"{p}/Start", start, methods=["POST"]),
        Route(f"{p}/List", list_processes, methods=["POST"]),
    ]
    for method in ("Connect", "SendSignal", "SendInput", "CloseStdin", "Update", "StreamInput"):
        routes.append(Route(f"{p}/{method}", no_such_process, methods=["POST"]))
    return routes
