"""Governed tools from inside a sandcell sandbox (standalone: no sandcell import needed).

::

    import sandcell_tools as tools
    tools.list()                                       # names, descriptions, argument schemas
    tools.call("tickets.search_tickets", query="refund", limit=50)

    $ python -m sandcell_tools list
    $ python -m sandcell_tools call tickets.search_tickets --json '{"query": "refund"}'

Each call is one connection to the host's tool gateway over the Unix socket named by
``$SANDCELL_TOOLS_SOCKET``. The gateway holds every credential and decides; a refusal raises
:class:`ToolError` with its reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
from typing import Any

__all__ = ["ToolError", "call", "list"]

_HEADER = struct.Struct(">I")
_MAX_ANSWER = 64 * 1024 * 1024
_builtin_list = list


class ToolError(Exception):
    """The gateway refused or failed a request; the message says why."""


def list() -> _builtin_list[dict[str, Any]]:
    """Every operation the profile allows: ``name``, ``description``, ``input_schema``,
    ``approval``."""
    result = _request({"op": "list"})
    assert isinstance(result, _builtin_list)
    return result


def call(name: str, /, **args: Any) -> Any:
    """Call ``name`` (``tool.operation``) with keyword arguments; the result."""
    return _request({"op": "call", "tool": name, "args": args})


def _request(message: dict[str, Any]) -> Any:
    path = os.environ.get("SANDCELL_TOOLS_SOCKET")
    if not path:
        raise ToolError("no tool gateway: $SANDCELL_TOOLS_SOCKET is not set in this sandbox")
    body = json.dumps(message).encode("utf-8")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
            # The gateway may refuse before reading it all; its answer is waiting then.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(_HEADER.pack(len(body)) + body)
            (size,) = _HEADER.unpack(_read(sock, _HEADER.size))
            if size > _MAX_ANSWER:
                raise ToolError(f"the gateway's answer is too large ({size} bytes)")
            answer = json.loads(_read(sock, size).decode("utf-8"))
        except OSError as exc:
            raise ToolError(f"the tool gateway cannot be reached at {path}: {exc}") from None
    if not isinstance(answer, dict) or "ok" not in answer:
        raise ToolError("the tool gateway gave an unreadable answer")
    if not answer["ok"]:
        raise ToolError(str(answer.get("error", "refused")))
    return answer.get("result")


def _read(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ToolError("the tool gateway closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(argv: _builtin_list[str] | None = None) -> int:
    """``python -m sandcell_tools list|call NAME --json ARGS``; prints JSON."""
    parser = argparse.ArgumentParser(prog="sandcell_tools", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the tools this sandbox may call")
    p = sub.add_parser("call", help="call one tool")
    p.add_argument("name")
    p.add_argument("--json", default="{}", metavar="ARGS", help="arguments as a JSON object")
    ns = parser.parse_args(argv)
    try:
        if ns.command == "list":
            out = list()
        else:
            args = json.loads(ns.json)
            if not isinstance(args, dict):
                raise ToolError("--json must be a JSON object")
            out = call(ns.name, **args)
    except (ToolError, ValueError) as exc:
        print(f"sandcell_tools: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
