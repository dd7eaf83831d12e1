"""envd's files: ``GET``/``POST /files`` and the ``filesystem.Filesystem`` RPCs.

Every operation is a cell in the sandbox (:mod:`sandcell.e2b.fs_cells`), so it is gated by the
profile, recorded, and reaches what the sandbox's user may reach there, nothing of the host.
Reading a workspace file is an export of it: the profile's export rules and the host's export
checks (regular files only, no links) decide what leaves, and the export is in the record like
any other. A file elsewhere in the sandbox is read by a cell, as code could, within the
profile's stdout limit.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.parser
import email.policy
import json
import posixpath
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandcell.e2b.access import sandbox_of, service_of
from sandcell.e2b.connect_rpc import read_message, unary
from sandcell.e2b.errors import E2BError
from sandcell.e2b.fs_cells import Entry, Op, cell_for, entries_of, reply_of
from sandcell.e2b.inflate import gunzip_bounded
from sandcell.e2b.paths import in_sandbox, shown, workspace_part
from sandcell.e2b.registry import E2BSandbox
from sandcell.e2b.runner import admit_cell, run_cell
from sandcell.e2b.signed_urls import signed_sandbox

__all__ = ["file_routes"]

_MAX_DEPTH = 16


_METADATA_HEADER = "x-metadata-"
# What the SDK itself checks before sending (header token keys, printable ASCII values).
_METADATA_KEY = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,200}\Z")
_METADATA_VALUE = re.compile(r"\A[\x20-\x7e]{0,4096}\Z")
_READ_MARGIN = 4096
"""Bytes of a read cell's stdout that are not the file (the reply's mark and JSON)."""


async def _op(request: Request, box: E2BSandbox, op: Op, path: str, arg: str = "") -> Any:
    service = service_of(request)
    full = in_sandbox(path, workspace=box.workspace)
    tenant = admit_cell(service, box)
    result = await run_cell(service, tenant, box, cell_for(op, full, arg))
    return reply_of(result, path)


def _glob_escape(path: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


async def _export(request: Request, box: E2BSandbox, path: str, relative: str) -> Response:
    service = service_of(request)
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
    raise E2BError(
        404,
        f"file {path!r} does not exist, or is reached through a link (a workspace file is read "
        "as an export, which follows no link: read the link's target)",
    )


async def read_path(request: Request, box: E2BSandbox, path: str) -> Response:
    """The file ``path`` (an E2B path) as the sandbox sees it."""
    full = in_sandbox(path, workspace=box.workspace)
    relative = workspace_part(full, workspace=box.workspace)
    if relative == "":
        raise E2BError(400, f"path {path!r} is a directory, not a file")
    if relative is not None:
        return await _export(request, box, path, relative)
    # Sent back hex-encoded on stdout, so the file may be at most half the stdout limit.
    stdout_bytes = box.session.request.effective_limits.stdout_bytes
    most = max((stdout_bytes - _READ_MARGIN) // 2, 0)
    reply = await _op(
        request, box, "read", path, json.dumps({"most": most, "workspace": box.workspace})
    )
    workspace_file = reply.get("workspace_file")
    if isinstance(workspace_file, str):
        return await _export(request, box, path, workspace_file)
    try:
        data = bytes.fromhex(str(reply["hex"]))
    except (KeyError, ValueError):
        raise E2BError(500, "the read gave back something other than the file") from None
    return Response(data, media_type="application/octet-stream")


async def read_file(request: Request) -> Response:
    box = signed_sandbox(request, "read") or sandbox_of(request)
    return await read_path(request, box, request.query_params.get("path") or "")


def metadata_of(request: Request) -> dict[str, str]:
    """The file metadata of an upload (``X-Metadata-<key>`` headers; keys lowercased, as envd
    does), or a 400 naming what is wrong."""
    found: dict[str, str] = {}
    for name, value in request.headers.items():
        if not name.lower().startswith(_METADATA_HEADER):
            continue
        key = name[len(_METADATA_HEADER) :].lower()
        if not _METADATA_KEY.match(key):
            raise E2BError(400, f"metadata key {key!r}: use 1 to 200 HTTP token characters")
        if not _METADATA_VALUE.match(value):
            raise E2BError(
                400, f"metadata value of {key!r}: use at most 4096 printable ASCII characters"
            )
        found[key] = value
    return found


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


async def write_path(
    request: Request, box: E2BSandbox, uploads: list[tuple[str, bytes]]
) -> list[dict[str, Any]]:
    """Write each ``(path, data)`` with the request's metadata; what the SDK reads back."""
    metadata = metadata_of(request)
    written = []
    for path, data in uploads:
        spec = json.dumps({"data": base64.b64encode(data).decode(), "metadata": metadata})
        entry = entries_of(await _op(request, box, "write", path, spec))[0]
        item: dict[str, Any] = {
            "name": posixpath.basename(entry.path),
            "type": "file",
            "path": shown(entry.path, workspace=box.workspace),
        }
        if entry.metadata:
            item["metadata"] = entry.metadata
        written.append(item)
    return written


async def write_files(request: Request) -> Response:
    box = signed_sandbox(request, "write") or sandbox_of(request)
    uploads = _uploads(request, await request.body())
    if len(uploads) == 1 and request.query_params.get("path"):
        # With one file, the path parameter names it (the part's filename may be a bare name).
        uploads = [(request.query_params["path"], uploads[0][1])]
    return JSONResponse(await write_path(request, box, uploads))


# -- filesystem.Filesystem ---------------------------------------------------------------------


_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}


def _permissions(mode: int, kind: str) -> str:
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return {"dir": "d", "symlink": "l"}.get(kind, "-") + bits


def entry_json(entry: Entry, *, workspace: str) -> dict[str, Any]:
    path = shown(entry.path, workspace=workspace)
    out: dict[str, Any] = {
        "name": posixpath.basename(path) or "/",
        "type": _TYPES[entry.kind],
        "path": path,
        "size": str(entry.size),
        "mode": entry.mode & 0o7777,
        "permissions": _permissions(entry.mode, entry.kind),
        "owner": "root" if entry.uid == 0 else "user",
        "group": "root" if entry.gid == 0 else "user",
        "modifiedTime": dt.datetime.fromtimestamp(entry.mtime, dt.UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if entry.link:
        out["isSymlink"] = True
    if entry.target is not None:
        target = entry.target
        out["symlinkTarget"] = shown(target, workspace=workspace) if target[:1] == "/" else target
    if entry.metadata:
        out["metadata"] = entry.metadata
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
    return unary({"entry": entry_json(entries_of(reply)[0], workspace=box.workspace)})


async def list_dir(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    depth = message.get("depth") or 1
    if not isinstance(depth, int) or not 1 <= depth <= _MAX_DEPTH:
        raise E2BError(400, f"depth: give a whole number from 1 to {_MAX_DEPTH}")
    reply = await _op(request, box, "list", _path_of(message), str(depth))
    entries = [entry_json(e, workspace=box.workspace) for e in entries_of(reply)]
    return unary({"entries": entries})


async def make_dir(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    reply = await _op(request, box, "mkdir", _path_of(message))
    return unary({"entry": entry_json(entries_of(reply)[0], workspace=box.workspace)})


async def remove(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    await _op(request, box, "remove", _path_of(message))
    return unary({})


async def move(request: Request) -> Response:
    box = sandbox_of(request)
    message = await _rpc_message(request)
    destination = in_sandbox(_path_of(message, "destination"), workspace=box.workspace)
    reply = await _op(request, box, "rename", _path_of(message, "source"), destination)
    return unary({"entry": entry_json(entries_of(reply)[0], workspace=box.workspace)})


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
