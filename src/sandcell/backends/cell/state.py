"""What a live sandbox can keep of itself: its state saved to a directory, and brought back.

Part of the cell contract (:mod:`sandcell.backends.cell`). A session pauses, snapshots or forks
by asking its sandbox to :meth:`~sandcell.backends.cell.CellSandbox.save` itself into an empty
host directory the session owns, and comes back by opening a sandbox of the same rung with a
:class:`RestorePoint` naming that directory (:meth:`~sandcell.backends.base.Backend.
session_sandbox`). What goes into the directory is the rung's own business (a QEMU migration
stream and its RAM file, a ``runsc checkpoint`` image, a copy of the workspace); the session
hashes every file in it and refuses a directory whose bytes changed (:mod:`sandcell.sessions.
states`), so a rung never reads a state that was not the one it wrote.

Two modes, :class:`PauseMode`:

* ``memory``: the interpreter, its variables, the processes and the files. A rung offers it only
  where it can bring the sandbox back under the same confinement as the one it saved; where it
  cannot (the namespaces rung: CRIU cannot run on every host, and a restore must never land in a
  weaker sandbox) :meth:`save` raises :class:`PauseRefused` saying so.
* ``files``: the workspace's files only. Every rung offers it: the restored sandbox is a fresh one
  whose workspace holds the saved files; its interpreter starts empty.

A restore never changes the state directory (several sandboxes may come back from one at once:
the forks of a session, the sessions started from one snapshot), and every restored sandbox's
kernel gets fresh entropy and reseeds Python's ``random`` before its first cell (as after
``os.fork``), so copies of one state do not draw the same numbers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.errors import ConfigError


class PauseMode(enum.StrEnum):
    """What a saved state keeps (see the module's docstring)."""

    MEMORY = "memory"
    FILES = "files"


class PauseRefused(ConfigError):
    """The sandbox cannot save itself in the mode asked for; the message says why and which mode
    it offers instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedState:
    """What a rung wrote into a state directory, as it needs to know it again to restore."""

    backend: str
    """The rung that wrote it; only that rung restores it."""
    mode: PauseMode
    detail: Mapping[str, str] = field(default_factory=dict)
    """Facts the rung checks before restoring (its versions, the machine it saved, the
    workspace's path inside the sandbox); strings only, kept in the state's manifest."""

    def to_dict(self) -> dict[str, object]:
        return {"backend": self.backend, "mode": self.mode.value, "detail": dict(self.detail)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SavedState:
        detail = data.get("detail") or {}
        if not isinstance(detail, Mapping):
            raise ConfigError("a saved state's detail must be a mapping")
        return cls(
            backend=str(data["backend"]),
            mode=PauseMode(str(data["mode"])),
            detail={str(k): str(v) for k, v in detail.items()},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RestorePoint:
    """Where a sandbox comes back from: a state directory whose hashes the session checked, and
    what the rung said of it when it saved it. The directory is read-only to the rung."""

    state_dir: Path
    saved: SavedState


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxMetrics:
    """One sample of a live sandbox's resources (E2B's ``get_metrics``, ``session show``)."""

    timestamp: str
    """ISO 8601, UTC, when it was sampled."""
    cpu_count: int
    """CPUs the sandbox may use."""
    cpu_used_pct: float
    """CPU used since the previous sample (or since the sandbox started), as a percentage of
    one CPU times ``cpu_count``."""
    mem_used_bytes: int
    mem_total_bytes: int
    """The sandbox's memory limit."""
    disk_used_bytes: int
    """Bytes in the workspace."""
    disk_total_bytes: int
    """The workspace's size limit."""

    def to_dict(self) -> dict[str, object]:
        return {
            "timestamp": self.timestamp,
            "cpu_count": self.cpu_count,
            "cpu_used_pct": self.cpu_used_pct,
            "mem_used_bytes": self.mem_used_bytes,
            "mem_total_bytes": self.mem_total_bytes,
            "disk_used_bytes": self.disk_used_bytes,
            "disk_total_bytes": self.disk_total_bytes,
        }


__all__ = ["PauseMode", "PauseRefused", "RestorePoint", "SandboxMetrics", "SavedState"]
