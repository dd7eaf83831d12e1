"""envd's terminals (``sandbox.pty``): the size a ``Start`` asks for, and ``Update`` (resize).

A terminal is a process of the session started on a pseudo-terminal of the sandbox's own
(:meth:`Session.spawn` with ``pty``): ``tty`` in it prints ``/dev/pts/N``, its output is the
stream's ``pty`` data, input sent to it is typed into it, and a resize sets its size and sends
it SIGWINCH.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.connect_rpc import read_message, unary
from sandcell.e2b.errors import E2BError
from sandcell.e2b.process_stream import in_session

__all__ = ["pty_routes", "pty_size", "selected_pid"]


def pty_size(pty: Any) -> tuple[int, int] | None:
    """(rows, cols) of a request's ``pty`` (None without one), or a 400."""
    if pty is None:
        return None
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise E2BError(400, "pty.size: give the terminal's rows and cols")
    rows, cols = size.get("rows"), size.get("cols")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (rows, cols)):
        raise E2BError(400, "pty.size: rows and cols are whole numbers")
    assert isinstance(rows, int) and isinstance(cols, int)
    if not (0 < rows < 65536 and 0 < cols < 65536):
        raise E2BError(400, f"pty.size: rows and cols are 1 to 65535, not {rows}x{cols}")
    return rows, cols


def selected_pid(selector: Any) -> int:
    """The pid a ``ProcessSelector`` names, or a 400 (a tag is resolved by the caller)."""
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if isinstance(pid, str) and pid.isdigit():
        pid = int(pid)  # proto3 JSON allows numbers as strings
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise E2BError(400, "process: give the process's pid")
    return pid


async def update(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    message = read_message(await request.body(), request.headers.get("content-type", ""))
    pid = selected_pid(message.get("process"))
    size = pty_size(message.get("pty"))
    if size is None:
        raise E2BError(400, "pty: give the terminal's new size (the only update served)")
    await in_session(service, box, lambda s: s.resize(pid, *size))
    return unary({})


def pty_routes() -> list[Route]:
    return [Route("/process.Process/Update", update, methods=["POST"])]
