"""E2B paths to workspace paths: the only files an E2B client reaches are the workspace's.

E2B clients name files as absolute paths under the user's home (``/home/user/data.csv``) or
relative to it. Both map onto the session's workspace; so does a path under the workspace's own
name inside the sandbox. Anything else (``/etc/passwd``, a ``..`` component, a NUL) is refused
here, before a cell is generated; a symlink leading out is refused inside the sandbox by the
cell that resolves the path (:mod:`sandcell.e2b.fs_cells`).
"""

from __future__ import annotations

from sandcell.e2b.errors import E2BError

__all__ = ["HOME", "e2b_path", "workspace_relative"]

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
