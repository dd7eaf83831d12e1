"""File operations as generated cells: the workspace is reached only from inside the sandbox.

Each operation is one Python cell (so the profile gates it and the record has it) that resolves
the path inside the sandbox, refuses one that leads out of the workspace (a symlink pointing
out included), does the operation and prints one marked JSON line the host reads back. Reading
a file is an export instead (:mod:`sandcell.e2b.files`), so the profile's export rules and the
host's export checks decide what leaves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from sandcell.e2b.errors import E2BError
from sandcell.spec import RunResult

__all__ = ["MARK", "Op", "cell_for", "reply_of"]

MARK = "<sandcell-e2b-reply> "
Op = Literal["stat", "list", "mkdir", "remove", "write", "rename", "pwd"]

# The cell's code: one function, called once and deleted, so the session's namespace keeps
# nothing of it. It imports inside the function for the same reason.
_BODY = """
def _sandcell_e2b(op, rel, arg):
    import base64, os, shutil
    root = os.path.realpath(os.environ.get("SANDCELL_E2B_ROOT") or {workspace!r})
    if op == "pwd":
        return {{"root": os.getcwd()}}

    def inside(p):
        return p == root or p.startswith(root + os.sep)

    def entry(r):
        full = os.path.join(root, r) if r else root
        st = os.lstat(full)
        kind = "symlink" if os.path.islink(full) else "dir" if os.path.isdir(full) else "file"
        return {{"rel": r, "kind": kind, "size": st.st_size, "mode": st.st_mode,
                 "mtime": st.st_mtime, "uid": st.st_uid, "gid": st.st_gid,
                 "target": os.readlink(full) if kind == "symlink" else None}}

    def place(r):
        full = os.path.join(root, r) if r else root
        if not inside(os.path.realpath(full)):
            raise PermissionError(r)
        return full

    try:
        target = place(rel)
        if op == "write":
            os.makedirs(os.path.dirname(target) or root, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(arg))
            return {{"entry": entry(rel)}}
        if op == "mkdir":
            if os.path.lexists(target):
                return {{"error": "exists"}}
            os.makedirs(target)
            return {{"entry": entry(rel)}}
        if not os.path.lexists(target):
            return {{"error": "missing"}}
        if op == "stat":
            return {{"entry": entry(rel)}}
        if op == "remove":
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
            return {{}}
        if op == "rename":
            dest = place(arg)
            os.makedirs(os.path.dirname(dest) or root, exist_ok=True)
            os.rename(target, dest)
            return {{"entry": entry(arg)}}
        if not os.path.isdir(target):
            return {{"error": "notdir"}}
        found = []
        level = [(rel, 1)]
        while level:
            here, depth = level.pop()
            for name in sorted(os.listdir(os.path.join(root, here) if here else root)):
                child = here + "/" + name if here else name
                e = entry(child)
                found.append(e)
                if e["kind"] == "dir" and depth < max(int(arg or 1), 1):
                    level.append((child, depth + 1))
        return {{"entries": found}}
    except PermissionError:
        return {{"error": "outside"}}
    except FileExistsError:
        return {{"error": "exists"}}
    except FileNotFoundError:
        return {{"error": "missing"}}
    except NotADirectoryError:
        return {{"error": "notdir"}}
    except OSError as exc:
        return {{"error": "os", "detail": str(exc)}}

import json as _sandcell_json
print({mark!r} + _sandcell_json.dumps(_sandcell_e2b({op!r}, {rel!r}, {arg!r})), flush=True)
del _sandcell_e2b, _sandcell_json
"""


def cell_for(op: Op, relative: str, arg: str = "", *, workspace: str) -> str:
    """The cell doing ``op`` on the workspace path ``relative`` (``arg``: the base64 content of
    a write, the destination of a rename, the depth of a listing)."""
    return _BODY.format(workspace=workspace, op=op, rel=relative, arg=arg, mark=MARK)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A file or directory as the cell saw it."""

    rel: str
    kind: Literal["file", "dir", "symlink"]
    size: int
    mode: int
    mtime: float
    uid: int
    gid: int
    target: str | None


def reply_of(result: RunResult, shown_path: str) -> dict[str, object]:
    """The operation's reply, or the E2B error for what went wrong (``shown_path``: the path as
    the client gave it, for the message)."""
    if result.outcome.value != "ok":
        reason = result.reason or "the file operation did not run"
        if result.outcome.value == "denied":
            raise E2BError(403, reason)
        raise E2BError(500, f"the file operation failed: {reason}")
    line = next((ln for ln in reversed(result.stdout.split("\n")) if ln.startswith(MARK)), None)
    if line is None:
        raise E2BError(500, "the file operation gave no answer (did a cell replace print?)")
    try:
        reply = json.loads(line[len(MARK) :])
    except ValueError:
        raise E2BError(500, "the file operation's answer is not JSON") from None
    if not isinstance(reply, dict):
        raise E2BError(500, "the file operation's answer is not an object")
    error = reply.get("error")
    if error == "missing":
        raise E2BError(404, f"path {shown_path!r} does not exist")
    if error == "exists":
        raise E2BError(409, f"path {shown_path!r} already exists")
    if error == "outside":
        raise E2BError(
            400, f"path {shown_path!r} leads outside the sandbox's workspace (a symlink out?)"
        )
    if error == "notdir":
        raise E2BError(400, f"path {shown_path!r} is not a directory")
    if error is not None:
        raise E2BError(500, f"path {shown_path!r}: {reply.get('detail', error)}")
    return reply


def entries_of(reply: dict[str, object]) -> list[Entry]:
    raw = reply.get("entries")
    if raw is None and "entry" in reply:
        raw = [reply["entry"]]
    if not isinstance(raw, list):
        raise E2BError(500, "the file operation's answer has no entries")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise E2BError(500, "the file operation's answer has a malformed entry")
        try:
            out.append(
                Entry(
                    rel=str(item["rel"]),
                    kind=item["kind"] if item["kind"] in ("file", "dir", "symlink") else "file",
                    size=int(item["size"]),
                    mode=int(item["mode"]),
                    mtime=float(item["mtime"]),
                    uid=int(item["uid"]),
                    gid=int(item["gid"]),
                    target=None if item.get("target") is None else str(item["target"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            raise E2BError(500, "the file operation's answer has a malformed entry") from None
    return out
