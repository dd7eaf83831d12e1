"""E2B paths to the sandbox's paths, and back.

E2B clients name files as absolute paths (``/home/user/data.csv``, ``/tmp/x``,
``/etc/os-release``) or relative to the user's home. The home is the session's workspace, so a
path under ``/home/user`` (or under the workspace's own name inside the sandbox) maps onto it;
any other absolute path is the same path inside the sandbox, where the sandbox's own user and
kernel decide what it may read or write (:mod:`sandcell.e2b.fs_cells`). Paths sent back show
the workspace as ``/home/user``.

Code contexts are the exception: their working directory must be in the workspace
(:func:`workspace_relative`).
"""

from __future__ import annotations

import posixpath

from sandcell.e2b.errors import E2BError

__all__ = ["HOME", "e2b_path", "in_sandbox", "shown", "workspace_part", "workspace_relative"]

HOME = "/home/user"
"""The home directory E2B clients assume, which is the workspace here."""


def workspace_relative(path: str, *, workspace: str) -> str:
    """``path`` relative to the workspace (``""`` for the workspace itself), or a 400."""
    if not path or "\x00" in path:
        raise E2BError(400, f"path {path!r}: give a file path under {HOME}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise E2BError(
            400, f"path {path!r} is outside the sandbox's workspace: '..' is not allowed"
        )
    if not path.startswith("/"):
        return "/".join(parts)
    for root in (HOME, workspace):
        root_parts = [p for p in root.split("/") if p]
        if parts[: len(root_parts)] == root_parts:
            return "/".join(parts[len(root_parts) :])
    raise E2BError(
        400,
        f"path {path!r} is outside the sandbox's workspace; only files under {HOME} (the "
        "workspace) can be reached",
    )


def e2b_path(relative: str) -> str:
    """The E2B path of a workspace-relative path."""
    return f"{HOME}/{relative}" if relative else HOME


def in_sandbox(path: str, *, workspace: str) -> str:
    """The absolute path inside the sandbox that the E2B path ``path`` names (``..`` resolved
    as the path reads, a relative path from the home), or a 400 for an empty one or a NUL."""
    if not path or "\x00" in path:
        raise E2BError(400, f"path {path!r}: give a file path (absolute, or relative to {HOME})")
    full = posixpath.normpath(posixpath.join(HOME, path))
    if full.startswith("//"):
        full = "/" + full.lstrip("/")
    if full == HOME or full.startswith(HOME + "/"):
        return workspace + full[len(HOME) :]
    return full


def workspace_part(path: str, *, workspace: str) -> str | None:
    """``path`` (absolute, inside the sandbox) relative to the workspace, or None outside it."""
    if path == workspace:
        return ""
    if path.startswith(workspace.rstrip("/") + "/"):
        return path[len(workspace.rstrip("/")) + 1 :]
    return None


def shown(path: str, *, workspace: str) -> str:
    """The E2B path of ``path`` (absolute, inside the sandbox): the workspace is the home."""
    relative = workspace_part(path, workspace=workspace)
    return path if relative is None else e2b_path(relative)
