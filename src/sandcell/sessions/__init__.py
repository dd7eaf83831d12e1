"""Sessions: one sandbox kept alive across cells, like a notebook kernel.

:class:`Session` (opened with :meth:`sandcell.Executor.session`) is the Python API; the CLI keeps
a session in a detached server process (:mod:`sandcell.sessions.server`) found through the
registry in the data directory (:mod:`sandcell.sessions.registry`).
"""

from __future__ import annotations

from sandcell.sessions.session import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    Session,
    SessionEnd,
    SessionEnded,
    SessionInfo,
)

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_LIFETIME_S",
    "Session",
    "SessionEnd",
    "SessionEnded",
    "SessionInfo",
]
