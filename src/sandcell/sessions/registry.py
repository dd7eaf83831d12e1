"""Where the CLI finds its sessions: ``<data dir>/sessions/ID.json`` and ``ID.sock``.

The directory is private (0700, owned by the user); each live session server writes one entry
with its pid and start time and listens on its socket (0600). An entry whose server is gone (it
crashed or was killed) is stale: :func:`sweep` removes it with its socket, and every rung's sweep
(:func:`sandcell.backends.registry.sweep_stale`) removes what its sandbox left (gVisor containers
in runsc's state, VMs, run directory, mounts, cgroups).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from sandcell.backends.host import workspace
from sandcell.backends.registry import sweep_stale
from sandcell.errors import ConfigError, InfraError

_ID = re.compile(r"^[0-9a-f]{8,32}$")
_MAX_SOCKET_PATH = 107
"""sun_path holds 108 bytes, the terminating NUL included."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One session server, as its registry file says."""

    id: str
    pid: int
    owner: str
    """The server's pid and start time (``pid-starttime``), so a reused pid is not taken for it."""
    profile: str
    created_at: str
    idle_timeout_s: float
    max_lifetime_s: float
    backend: str | None = None
    """The rung the session runs on; None in an entry written by an older server, which a
    listing still shows rather than sweeping a live session away as unreadable."""
    language: str = "python"
    """The language of the session's kernel (``Session.language``); ``python`` in an entry
    written by an older server."""

    def alive(self) -> bool:
        return workspace.owner_alive(self.owner)


def sessions_dir(home: Path) -> Path:
    """The registry directory, created private to this user."""
    d = home / "sessions"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.lstat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise InfraError(
            f"session directory {d} is not private to uid {os.geteuid()}; remove it, or point "
            "SANDCELL_HOME (--home) at a directory only you can write"
        )
    return d


def check_id(session_id: str) -> str:
    if not _ID.match(session_id):
        raise ConfigError(
            f"{session_id!r} is not a session id (8-32 hex digits); see `sandcell session list`"
        )
    return session_id


def socket_path(home: Path, session_id: str) -> Path:
    path = sessions_dir(home) / f"{check_id(session_id)}.sock"
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ConfigError(
            f"the session socket path {path} is longer than a unix socket allows; point "
            "SANDCELL_HOME (--home) at a shorter directory"
        )
    return path


def write(home: Path, entry: Entry) -> None:
    d = sessions_dir(home)
    tmp = d / f".{entry.id}.json.tmp"
    tmp.write_text(json.dumps(asdict(entry)))
    tmp.chmod(0o600)
    tmp.replace(d / f"{entry.id}.json")


def read(home: Path, session_id: str) -> Entry | None:
    path = sessions_dir(home) / f"{check_id(session_id)}.json"
    try:
        data = json.loads(path.read_text())
        return Entry(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise InfraError(f"session registry entry {path} is unreadable: {exc}") from exc


def remove(home: Path, session_id: str) -> None:
    d = sessions_dir(home)
    for name in (f"{session_id}.json", f"{session_id}.sock"):
        with contextlib.suppress(FileNotFoundError):
            (d / name).unlink()


def entries(home: Path) -> list[Entry]:
    """Every registered session whose server is alive; stale entries are swept on the way."""
    found: list[Entry] = []
    for path in sorted(sessions_dir(home).glob("*.json")):
        session_id = path.stem
        if not _ID.match(session_id):
            continue
        try:
            entry = read(home, session_id)
        except InfraError:
            entry = None
        if entry is None or not entry.alive():
            remove(home, session_id)
            continue
        found.append(entry)
    return found


def sweep(home: Path) -> list[str]:
    """Remove the entries of dead servers and what their sandboxes left. Returns what went."""
    before = {p.stem for p in sessions_dir(home).glob("*.json")}
    alive = {e.id for e in entries(home)}
    for sock in sessions_dir(home).glob("*.sock"):
        if sock.stem not in alive:
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
    return sorted(before - alive) + sweep_stale()


__all__ = [
    "Entry",
    "check_id",
    "entries",
    "read",
    "remove",
    "sessions_dir",
    "socket_path",
    "sweep",
    "write",
]
