"""envd's files: ``GET``/``POST /files`` and the ``filesystem.Filesystem`` RPCs.

Every operation is a cell in the sandbox (:mod:`sandcell.e2b.fs_cells`), so it is gated by the
profile, recorded, and reaches nothing but the workspace. A read is an export of the file:
the profile's export rules and the host's export checks (regular files only, no links) decide
what leaves, and the export is in the record like any other.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.parser
import email.policy
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.connect_rpc import read_message, unary
from sandcell.e2b.errors import E2BError
from sandcell.e2b.fs_cells import Entry, Op, cell_for, entries_of, reply_of
from sandcell.e2b.inflate import gunzip_bounded
from sandcell.e2b.paths import e2b_path, workspace_relative
from sandcell.e2b.registry import E2BSandbox
from sandcell.e2b.runner import admit_cell, run_cell

__all__ = ["file_routes"]

_MAX_DEPTH = 16


async def _op(request: Request, box: E2BSandbox, op: Op, path: str, arg: str = "") -> Any:
    service = service_of(request)
    relative = workspace_relative(path, workspace=box.workspace)
    tenant = admit_cell(service, box)
    code = cell_for(op, relative, arg, workspace=box.workspace)
    result = await run_cell(service, tenant, box, code)
    return reply_of(result, path)


def _glob_escape(path: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


async def read_file(request: Request) -> Response:
    box = sandbox_of(request)
    service = service_of(request)
    path = request.query_params.get("path") or ""
    relative = workspace_relative(path, workspace=box.workspace)
    if not relative:
        raise E2BError(400, f"path {path!r} is a directory, not a file")
    tenant = admit_cell(service, box)
    result = await run_cell(service, tenant, box, "pass", exports=(_glob_escape(relative),))
    for artifact in result.artifacts:
        if artifact.path == relative:
            data = service.executor.store.path_for(artifact.sha256).read_bytes()
            return Response(
                data,
                media_type="application/octet-stream",
                headers={"X-Sandcell-Run-Id": result.run_id},
            )
    why = next((r.reason for r in result.rejected_exports if r.path == relative), None)
    if why is not None:
        raise E2BError(403, f"{path!r} may not leave the sandbox: {why}")
    if result.outcome.value != "ok":
        raise E2BError(403 if result.outcome.value == "denied" else 500, result.reason)
    raise E2BError(404, f"file {path!r} does not exist")


def _uploads(request: Request, body: bytes) -> list[tuple[str, bytes]]:
    content_type = request.headers.get("content-type", "")
    encoding = request.headers.get("content-encoding", "").lower()
    if encoding == "gzip":
        # The body limit counted the compressed bytes; the same limit bounds what they become.
        body = gunzip_bounded(body, limit=service_of(request).config.max_body_bytes)
    elif encoding not in ("", "identity"):
        raise E2BError(400, f"content encoding {encoding!r} is not served; use gzip or none")
    path = request.query_params.get("path")
    if not content_type.lower().startswith("multipart/"):
        if not path:
            raise E2BError(400, "an octet-stream upload needs the path query parameter")
        return [(path, body)]
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise E2BError(400, "the multipart body could not be read")
    files: list[tuple[str, bytes]] = []
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") != "file":
            continue
        name = part.get_filename() or path
        payload = part.get_payload(decode=True)
        if not name:
            raise E2BError(400, "a file part has no filename and there is no path parameter")
        files.append((name, payload if isinstance(payload, bytes) else b""))
    if not files:
        raise E2BError(400, "the upload has no part named 'file'")
    return files


async def write_files(request: Request) -> Response:
    box = sandbox_of(request)
    uploads = _uploads(request, await request.body())
    if len(uploads) == 1 and request.query_params.get("path"):
        # With one file, the path parameter names it (the part's filename may be a bare name).
        uploads = [(request.query_params["path"], uploads[0][1])]
    written = []
    for path, data in uploads:
        reply = await _op(request, box, "write", path, base64.b64encode(data).decode())
        entry = entries_of(reply)[0]
        name = entry.rel.rsplit("/", 1)[-1]
        written.append({"name": name, "type": "file", "path": e2b_path(entry.rel)})
    return JSONResponse(written)


# -- filesystem.Filesystem ---------------------------------------------------------------------


_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}


def _permissions(mode: int, kind: str) -> str:
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return {"dir": "d", "symlink": "l"}.get(kind, "-") + bits


def entry_json(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": entry.rel.rsplit("/", 1)[-1] if entry.rel else "user",
        "type": _TYPES[entry.kind],
        "path": e2b_path(entry.rel),
        "size": str(entry.size),
        "mode": entry.mode & 0o7777,
        "permissions": _permissions(entry.mode, entry.kind),
        "owner": "user",
        "group": "user",
        "modifiedTime": dt.datetime.fromtimestamp(entry.mtime, dt.UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if entry.target is not None:
        out["symlinkTarget"] = entry.target
    return out


def _path_of(message: dict[str, Any], key: str = "path") -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise E2BError(400, f"{key}: give a path")
    return value


async def _rpc_message(request: Request) -> dict[str, Any]:
    return read_message(await request.body(), request.headers.get("content-type", ""))


async def stat(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    reply = await _op(request, box, "stat", _path_of(message))
    return unary({"entry": entry_json(entries_of(reply)[0])})


async def list_dir(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    depth = message.get("depth") or 1
    if not isinstance(depth, int) or not 1 <= depth <= _MAX_DEPTH:
        raise E2BError(400, f"depth: give a whole number from 1 to {_MAX_DEPTH}")
    reply = await _op(request, box, "list", _path_of(message), str(depth))
    return unary({"entries": [entry_json(e) for e in entries_of(reply)]})


async def make_dir(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    reply = await _op(request, box, "mkdir", _path_of(message))
    return unary({"entry": entry_json(entries_of(reply)[0])})


async def remove(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    await _op(request, box, "remove", _path_of(message))
    return unary({})


async def move(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    destination = _path_of(message, "destination")
    relative = workspace_relative(destination, workspace=box.workspace)
    reply = await _op(request, box, "rename", _path_of(message, "source"), relative)
    return unary({"entry": entry_json(entries_of(reply)[0])})


def file_routes() -> list[Route]:
    fs = "/filesystem.Filesystem"
    return [
        Route("/files", read_file, methods=["GET"]),
        Route("/files", write_files, methods=["POST"]),
        Route(f"{fs}/Stat", stat, methods=["POST"]),
        Route(f"{fs}/ListDir", list_dir, methods=["POST"]),
        Route(f"{fs}/MakeDir", make_dir, methods=["POST"]),
        Route(f"{fs}/Remove", remove, methods=["POST"]),
        Route(f"{fs}/Move", move, methods=["POST"]),
    ]
