"""File operations as generated cells: the sandbox's files are reached only from inside it.

Each operation is one Python cell (so the profile gates it and the record has it) that does
the operation on the path as the sandbox sees it, with the sandbox user's rights, and prints
one marked JSON line the host reads back. Nothing is done from the host's side: a path the
sandbox cannot read or write is refused by the sandbox's own kernel (or VM), and a symlink
leads where it leads inside the sandbox. Reading a file of the workspace is an export instead
(:mod:`sandcell.e2b.files`), so the profile's export rules decide what leaves; a file elsewhere
(``/etc/os-release``, ``/tmp/x``) is read by a cell like any code would, within the profile's
output limit.

File metadata is kept where E2B keeps it, as ``user.e2b.*`` extended attributes of the file;
a file system that cannot hold them (gVisor's; tmpfs before Linux 6.6, as in the microVM
guest) refuses a write that asks for metadata, and the file is not left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from sandcell.e2b.errors import E2BError
from sandcell.spec import RunResult

__all__ = ["MARK", "Entry", "Op", "cell_for", "entries_of", "reply_of"]

MARK = "<sandcell-e2b-reply> "
Op = Literal["stat", "list", "mkdir", "remove", "write", "rename", "read", "pwd"]

# The cell's code: one function, called once and deleted, so the session's namespace keeps
# nothing of it. It imports inside the function for the same reason.
_BODY = """
def _sandcell_e2b(op, path, arg):
    import base64, json, os, shutil
    if op == "pwd":
        return {{"root": os.getcwd()}}
    prefix = "user.e2b."

    def metadata(full):
        try:
            names = os.listxattr(full)
        except OSError:
            return {{}}
        out = {{}}
        for name in names:
            if name.startswith(prefix):
                try:
                    out[name[len(prefix):]] = os.getxattr(full, name).decode("ascii", "replace")
                except OSError:
                    pass
        return out

    def entry(full):
        lst = os.lstat(full)
        link = os.path.islink(full)
        target = None
        st = lst
        if link:
            # As envd: the type is the target's, the link itself is marked, and the target
            # is where the link leads (resolved), or what it says when it leads nowhere.
            try:
                st = os.stat(full)
                target = os.path.realpath(full)
            except OSError:
                target = os.readlink(full)
        kind = "dir" if st.st_mode & 0o170000 == 0o040000 else "file"
        if link and st is lst:
            kind = "symlink"
        return {{"path": full, "kind": kind, "link": link, "size": st.st_size,
                 "mode": st.st_mode, "mtime": st.st_mtime, "uid": st.st_uid,
                 "gid": st.st_gid, "target": target,
                 "metadata": metadata(full) if kind != "symlink" else {{}}}}

    try:
        if op == "write":
            spec = json.loads(arg)
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            existed = os.path.lexists(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for key, value in spec["metadata"].items():
                    try:
                        os.setxattr(fd, prefix + key, value.encode("ascii"))
                    except OSError as exc:
                        os.close(fd)
                        fd = -1
                        if not existed:
                            os.unlink(path)
                        return {{"error": "nometa", "detail": os.strerror(exc.errno or 0)}}
                with os.fdopen(fd, "wb") as f:
                    fd = -1
                    f.write(base64.b64decode(spec["data"]))
            finally:
                if fd >= 0:
                    os.close(fd)
            return {{"entry": entry(path)}}
        if op == "mkdir":
            if os.path.lexists(path):
                return {{"error": "exists"}}
            os.makedirs(path)
            return {{"entry": entry(path)}}
        if not os.path.lexists(path):
            return {{"error": "missing"}}
        if op == "stat":
            return {{"entry": entry(path)}}
        if op == "read":
            spec = json.loads(arg)
            if os.path.isdir(path):
                return {{"error": "isdir"}}
            # A workspace file reached by another path (a link, /proc/self/cwd/...) is read
            # as the export it is when named directly, under the profile's export rules.
            real, home = os.path.realpath(path), os.path.realpath(spec["workspace"])
            if real.startswith(home + os.sep):
                return {{"workspace_file": real[len(home) + 1:]}}
            with open(path, "rb") as f:
                data = f.read(spec["most"] + 1)
            if len(data) > spec["most"]:
                return {{"error": "toobig"}}
            return {{"hex": data.hex()}}
        if op == "remove":
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            return {{}}
        if op == "rename":
            os.makedirs(os.path.dirname(arg) or "/", exist_ok=True)
            try:
                os.rename(path, arg)
            except OSError as exc:
                # EXDEV: /tmp and the workspace are separate mounts; copy, then remove.
                if exc.errno != 18:
                    raise
                shutil.move(path, arg)
            return {{"entry": entry(arg)}}
        if not os.path.isdir(path):
            return {{"error": "notdir"}}
        found = []
        level = [(path, 1)]
        while level:
            here, depth = level.pop()
            for name in sorted(os.listdir(here)):
                child = os.path.join(here, name)
                e = entry(child)
                found.append(e)
                # A link to a directory is listed, not entered: a loop cannot recurse forever.
                if e["kind"] == "dir" and not e["link"] and depth < max(int(arg or 1), 1):
                    level.append((child, depth + 1))
        return {{"entries": found}}
    except PermissionError as exc:
        return {{"error": "denied", "detail": str(exc)}}
    except FileExistsError:
        return {{"error": "exists"}}
    except FileNotFoundError:
        return {{"error": "missing"}}
    except NotADirectoryError:
        return {{"error": "notdir"}}
    except IsADirectoryError:
        return {{"error": "isdir"}}
    except OSError as exc:
        # EROFS (a read-only mount) is the sandbox refusing, as EACCES is.
        if exc.errno == 30:
            return {{"error": "denied", "detail": str(exc)}}
        return {{"error": "os", "detail": str(exc)}}

import json as _sandcell_json
print({mark!r} + _sandcell_json.dumps(_sandcell_e2b({op!r}, {path!r}, {arg!r})), flush=True)
del _sandcell_e2b, _sandcell_json
"""


def _judged(paths: list[str]) -> str:
    # The operation's paths as literals of a path call, so that the profile's path checks judge
    # this cell as they judge code touching the same paths (a strict profile asks approval for
    # /etc in a file read as it does in run_code); the call itself changes nothing.
    lines = [f"_sandcell_os.path.exists({p!r})" for p in paths if p]
    if not lines:
        return ""
    return "import os as _sandcell_os\n" + "\n".join(lines) + "\ndel _sandcell_os\n"


def cell_for(op: Op, path: str, arg: str = "") -> str:
    """The cell doing ``op`` on ``path``, absolute as the sandbox sees it (``arg``: the JSON
    ``{"data": base64, "metadata": {...}}`` of a write, the absolute destination of a rename,
    the depth of a listing, the JSON ``{"most": bytes, "workspace": path}`` of a read)."""
    judged = _judged([path, arg] if op == "rename" else [path])
    return judged + _BODY.format(op=op, path=path, arg=arg, mark=MARK)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A file or directory as the cell saw it."""

    path: str
    """Absolute, as the sandbox sees it."""
    kind: Literal["file", "dir", "symlink"]
    """The target's type for a link (``symlink`` only when the link leads nowhere)."""
    link: bool
    size: int
    mode: int
    mtime: float
    uid: int
    gid: int
    target: str | None
    """Where a link leads (resolved), or its text when it leads nowhere."""
    metadata: dict[str, str]
    """The file's ``user.e2b.*`` extended attributes, without the prefix."""


_ERRORS: dict[str, tuple[int, str]] = {
    "missing": (404, "does not exist"),
    "exists": (409, "already exists"),
    "notdir": (400, "is not a directory"),
    "isdir": (400, "is a directory, not a file"),
    "denied": (403, "may not be reached by the sandbox's user (permission denied inside it)"),
    "toobig": (413, "is larger than the profile's stdout limit lets a read return"),
    "nometa": (
        501,
        "could not keep the file's metadata: the sandbox's file system holds no user extended "
        "attributes (gVisor's does not, nor tmpfs before Linux 6.6, as in the microVM guest); "
        "write it without metadata, or use the namespaces backend",
    ),
}


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
    if error is None:
        return reply
    status, what = _ERRORS.get(str(error), (500, str(reply.get("detail", error))))
    raise E2BError(status, f"path {shown_path!r} {what}")


def _entry(item: object) -> Entry:
    if not isinstance(item, dict):
        raise E2BError(500, "the file operation's answer has a malformed entry")
    try:
        metadata = item.get("metadata") or {}
        return Entry(
            path=str(item["path"]),
            kind=item["kind"] if item["kind"] in ("file", "dir", "symlink") else "file",
            link=bool(item["link"]),
            size=int(item["size"]),
            mode=int(item["mode"]),
            mtime=float(item["mtime"]),
            uid=int(item["uid"]),
            gid=int(item["gid"]),
            target=None if item.get("target") is None else str(item["target"]),
            metadata={str(k): str(v) for k, v in dict(metadata).items()},
        )
    except (KeyError, TypeError, ValueError):
        raise E2BError(500, "the file operation's answer has a malformed entry") from None


def entries_of(reply: dict[str, object]) -> list[Entry]:
    raw = reply.get("entries")
    if raw is None and "entry" in reply:
        raw = [reply["entry"]]
    if not isinstance(raw, list):
        raise E2BError(500, "the file operation's answer has no entries")
    return [_entry(item) for item in raw]
