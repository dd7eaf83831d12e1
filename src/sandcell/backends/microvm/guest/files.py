"""The workspace's files going to the host: a run's exports, a session's listing and files.

Every walk starts from a directory opened without following a link and never follows one below
it; at most :data:`MAX_EXPORT_FILES` entries are looked at. A file that is not regular, named by
a glob, is reported (``L``) rather than read, so that the host refuses it as it would its own.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat

from .port import MAX_FRAME
from .system import open_dir_nofollow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .port import Port

DISPLAY_DIRNAME = ".sandcell-display"
MAX_EXPORT_FILES = 10000
OUTPUTS_ROOT = "/tmp/.sandcell-outputs"
"""Where a session's kernel keeps each cell's display directory (``<root>/<cell number>``)."""
MAX_LISTED_PATH = 4096


def glob_match(parts: list[str], globs: list[str]) -> bool:
    """Whether the relative path ``parts`` matches one of ``globs`` (``**``: any depth), as the
    host's export globs match."""
    return any(_match(parts, g.split("/")) for g in globs)


def _match(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _match(parts[1:], pats[1:])


def _may_descend(parts: list[str], globs: list[str]) -> bool:
    for g in globs:
        pats = g.split("/")
        if "**" in pats[: len(parts) + 1]:
            return True
        if len(pats) > len(parts) and all(
            fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pats, strict=False)
        ):
            return True
    return False


def send_exports(
    port: Port, globs: list[str], display: bool, budget: int, root_dir: str = "/sandbox"
) -> None:
    """The files under ``root_dir`` matching ``globs`` (and the display directory if
    ``display``) as ``F``/``D`` frames, at most ``budget`` bytes of content in all."""
    if display:
        globs = [*globs, DISPLAY_DIRNAME, DISPLAY_DIRNAME + "/*"]
    if not globs:
        return
    state = {"files": 0, "bytes": 0}

    def walk(dir_fd: int, parts: list[str]) -> None:
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        for name in names:
            if state["files"] >= MAX_EXPORT_FILES:
                return
            state["files"] += 1
            p = [*parts, name]
            rel = "/".join(p)
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError:
                continue
            matched = glob_match(p, globs)
            if stat.S_ISDIR(st.st_mode):
                if matched:
                    port.send(b"F", json.dumps({"path": rel, "type": "dir", "size": 0}).encode())
                if len(p) < 64 and (matched or _may_descend(p, globs)):
                    try:
                        fd = os.open(
                            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd
                        )
                    except OSError:
                        continue
                    try:
                        walk(fd, p)
                    finally:
                        os.close(fd)
                continue
            if not stat.S_ISREG(st.st_mode):
                # Named (or passed through) by a glob: the host re-creates a stand-in so that
                # its own export checks refuse it as they would on the host.
                if matched or _may_descend(p, globs):
                    mode = st.st_mode
                    kind = (
                        "symlink"
                        if stat.S_ISLNK(mode)
                        else "socket"
                        if stat.S_ISSOCK(mode)
                        else "special"
                    )
                    port.send(b"L", json.dumps({"path": rel, "kind": kind}).encode())
                continue
            if not matched:
                continue
            if state["bytes"] + st.st_size > budget:
                skip = {"path": rel, "kind": "oversized", "size": st.st_size}
                port.send(b"L", json.dumps(skip).encode())
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                data = b""
                size = os.fstat(fd).st_size
                while len(data) < size:
                    chunk = os.read(fd, min(MAX_FRAME, size - len(data)))
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
            state["bytes"] += len(data)
            header = {"path": rel, "type": "file", "size": len(data), "nlink": st.st_nlink}
            port.send(b"F", json.dumps(header).encode())
            for i in range(0, len(data), MAX_FRAME):
                port.send(b"D", data[i : i + MAX_FRAME])

    try:
        root = open_dir_nofollow(root_dir)
    except OSError:
        return
    try:
        walk(root, [])
    finally:
        os.close(root)


def list_workspace(port: Port) -> None:
    """The regular files of /sandbox (relative paths), in batches, no link followed."""
    batch: list[str] = []
    size = 0
    count = 0

    def walk(dir_fd: int, prefix: str, depth: int) -> None:
        nonlocal size, count, batch
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        for name in names:
            if count >= MAX_EXPORT_FILES:
                return
            rel = prefix + name
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 64:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    walk(fd, rel + "/", depth + 1)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and len(rel) <= MAX_LISTED_PATH:
                count += 1
                batch.append(rel)
                size += len(rel) + 4
                if size > MAX_FRAME // 4:
                    port.send(b"N", json.dumps(batch).encode())
                    batch, size = [], 0

    try:
        root = open_dir_nofollow("/sandbox")
    except OSError:
        return
    try:
        walk(root, "", 0)
    finally:
        os.close(root)
    if batch:
        port.send(b"N", json.dumps(batch).encode())


def send_session_files(port: Port, payload: bytes) -> None:
    """Files the host asked for: workspace files matching globs, or one cell's display
    directory; any other place is refused (nothing sent)."""
    try:
        doc = json.loads(payload)
        root, globs, budget = doc["root"], doc["globs"], int(doc["budget"])
    except (ValueError, KeyError, TypeError):
        return
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        return
    if not isinstance(root, str):
        return
    cell = root[len(OUTPUTS_ROOT) + 1 :]
    if root != "/sandbox" and not (
        root.startswith(OUTPUTS_ROOT + "/") and cell.isdigit() and len(cell) < 16
    ):
        return
    send_exports(port, globs, False, budget, root_dir=root)
