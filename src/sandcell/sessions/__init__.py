"""Sessions: one sandbox kept alive across cells, like a notebook kernel, that can last.

:class:`Session` (opened with :meth:`sandcell.Executor.session`) is the Python API; the CLI keeps
a session in a detached server process (:mod:`sandcell.sessions.server`) found through the
registry in the data directory (:mod:`sandcell.sessions.registry`). A session can be paused and
resumed, copied into a named snapshot, and forked (:mod:`sandcell.sessions.saving`); its saved
states live under the home (:mod:`sandcell.sessions.states`) and each of those steps is an entry
of the audit chain (:mod:`sandcell.sessions.events`). Background processes, terminals and
directory watches in a session: :mod:`sandcell.sessions.processes`.
"""

from __future__ import annotations

from sandcell.backends.cell.state import PauseMode, PauseRefused, SandboxMetrics
from sandcell.sessions.processes import (
    ProcessInfo,
    ProcessNotFound,
    ProcessOutput,
    SpawnFailed,
    SpawnRefused,
    WatchEvent,
)
from sandcell.sessions.saving import MAX_FORKS
from sandcell.sessions.session import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    DEFAULT_PAUSED_TTL_S,
    OnIdle,
    Session,
    SessionEnd,
    SessionEnded,
    SessionInfo,
)
from sandcell.sessions.states import StateNotFound, StateTampered, StoredState

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_LIFETIME_S",
    "DEFAULT_PAUSED_TTL_S",
    "MAX_FORKS",
    "OnIdle",
    "PauseMode",
    "PauseRefused",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessOutput",
    "SandboxMetrics",
    "Session",
    "SessionEnd",
    "SessionEnded",
    "SessionInfo",
    "SpawnFailed",
    "SpawnRefused",
    "StateNotFound",
    "StateTampered",
    "StoredState",
    "WatchEvent",
]
