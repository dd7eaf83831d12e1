"""envd's process calls besides the streams: ``List``, ``SendSignal``, ``SendInput``,
``CloseStdin`` and ``StreamInput`` (``commands.list``/``kill``/``send_stdin``/``close_stdin``/
``stream_input``, the same on ``sandbox.pty``).

Each is an operation of the session's process manager (:mod:`sandcell.sessions.processes`), not
a run: none is judged by the profile or recorded, as reading a file's listing is not. ``List``
shows the processes still running, as envd does; a signal or input for a process that is not
running answers ``not_found`` (the SDK's ``kill`` then returns ``False``).
"""

from __future__ import annotations

import base64
import binascii
import json
import signal as signals
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.connect_rpc import STREAM_TYPE, end_of_stream, envelope, read_message, unary
from sandcell.e2b.errors import E2BError
from sandcell.e2b.paths import shown
from sandcell.e2b.process_stream import in_session, streaming
from sandcell.e2b.pty import selected_pid
from sandcell.e2b.registry import E2BSandbox
from sandcell.service.core import Service
from sandcell.sessions.processes import ProcessInfo

__all__ = ["chosen", "process_control_routes"]

_SIGNALS = {
    "SIGNAL_SIGKILL": signals.SIGKILL,
    "SIGNAL_SIGTERM": signals.SIGTERM,
    9: signals.SIGKILL,
    15: signals.SIGTERM,
}
_MAX_INPUT_MESSAGE = 4 * 1024 * 1024


async def chosen(
    service: Service, box: E2BSandbox, selector: Any, *, exited_too: bool = False
) -> ProcessInfo:
    """The process a ``ProcessSelector`` names (by pid or tag; the newest of a tag), running
    unless ``exited_too``; a 404 ``not_found`` otherwise."""
    tag = selector.get("tag") if isinstance(selector, dict) else None
    pid = None if isinstance(tag, str) else selected_pid(selector)
    found = await in_session(service, box, lambda s: s.processes())
    for info in reversed(found):
        if (info.pid == pid or (tag is not None and info.tag == tag)) and (
            exited_too or not info.exited
        ):
            return info
    named = f"tagged {tag!r}" if tag is not None else str(pid)
    raise E2BError(404, f"no running process {named} in this sandbox", code="not_found")


def _listed(info: ProcessInfo, box: E2BSandbox) -> dict[str, Any]:
    # The sandbox's own variables ride with every command; the listing shows the command's.
    envs = {k: v for k, v in info.env.items() if box.env.get(k) != v}
    config = {
        "cmd": info.argv[0],
        "args": list(info.argv[1:]),
        "envs": envs,
        "cwd": shown(info.cwd or box.workspace, workspace=box.workspace),
    }
    listed: dict[str, Any] = {"config": config, "pid": info.pid}
    if info.tag is not None:
        listed["tag"] = info.tag
    return listed


async def _message(request: Request) -> dict[str, Any]:
    return read_message(await request.body(), request.headers.get("content-type", ""))


async def list_processes(request: Request) -> Response:
    box = sandbox_of(request)
    found = await in_session(service_of(request), box, lambda s: s.processes())
    return unary({"processes": [_listed(p, box) for p in found if not p.exited]})


async def send_signal(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = await _message(request)
    sig = _SIGNALS.get(message.get("signal"))
    if sig is None:
        raise E2BError(400, "signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    info = await chosen(service, box, message.get("process"))
    await in_session(service, box, lambda s: s.signal(info.pid, sig))
    return unary({})


def _input_bytes(given: Any) -> bytes:
    """The bytes of a ``ProcessInput`` (``stdin`` or ``pty``, base64)."""
    data = None
    if isinstance(given, dict):
        data = given.get("stdin", given.get("pty"))
    if not isinstance(data, str):
        raise E2BError(400, "input: give stdin or pty bytes")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise E2BError(400, "input: the bytes are not base64") from None


async def _pid(service: Service, box: E2BSandbox, selector: Any) -> int:
    if isinstance(selector, dict) and isinstance(selector.get("tag"), str):
        return (await chosen(service, box, selector)).pid
    return selected_pid(selector)


async def send_input(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = await _message(request)
    data = _input_bytes(message.get("input"))
    pid = await _pid(service, box, message.get("process"))
    await in_session(service, box, lambda s: s.send_stdin(pid, data))
    return unary({})


async def close_stdin(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = await _message(request)
    pid = await _pid(service, box, message.get("process"))
    await in_session(service, box, lambda s: s.close_stdin(pid))
    return unary({})


async def _send(service: Service, box: E2BSandbox, pid: int, data: bytes) -> None:
    await in_session(service, box, lambda s: s.send_stdin(pid, data))


async def stream_input(request: Request) -> Response:
    """A client stream: a ``start`` naming the process, then ``data`` messages, each sent to its
    input as it arrives; answered with one empty message when the client's stream ends."""
    box = sandbox_of(request)
    service = service_of(request)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != STREAM_TYPE:
        raise E2BError(400, f"StreamInput is a client stream: send {STREAM_TYPE}")
    pending, pid = b"", None
    async for chunk in request.stream():
        pending += chunk
        while len(pending) >= 5:
            size = int.from_bytes(pending[1:5], "big")
            if pending[0] & 0x01 or size > _MAX_INPUT_MESSAGE:
                raise E2BError(400, "each input message: uncompressed, at most 4 MiB")
            if len(pending) < 5 + size:
                break
            flags, body, pending = pending[0], pending[5 : 5 + size], pending[5 + size :]
            if flags & 0x02:
                continue  # the client's end of stream
            try:
                event = json.loads(body or b"{}")
            except ValueError:
                raise E2BError(400, "an input message is not JSON") from None
            if not isinstance(event, dict):
                raise E2BError(400, "an input message is not a JSON object")
            if isinstance(event.get("start"), dict):
                pid = await _pid(service, box, event["start"].get("process"))
            elif isinstance(event.get("data"), dict):
                if pid is None:
                    raise E2BError(400, "StreamInput: send start (the process) before data")
                await _send(service, box, pid, _input_bytes(event["data"].get("input")))
    return Response(envelope({}) + end_of_stream(), media_type=STREAM_TYPE)


def process_control_routes() -> list[Route]:
    p = "/process.Process"
    return [
        Route(f"{p}/List", list_processes, methods=["POST"]),
        Route(f"{p}/SendSignal", send_signal, methods=["POST"]),
        Route(f"{p}/SendInput", send_input, methods=["POST"]),
        Route(f"{p}/CloseStdin", close_stdin, methods=["POST"]),
        Route(f"{p}/StreamInput", streaming(stream_input), methods=["POST"]),
    ]
