"""The sessions an MCP server opened, each tied to the client that opened it.

A session belongs to its owner: on a handshake-era connection (stdio, stateful streamable HTTP)
the connection itself, and it is closed when that connection ends; on the stateless 2026-era
protocol, where every request stands alone, the authenticated principal (or nobody, over stdio),
and it ends on its idle or lifetime limit, an explicit close, or the server's shutdown. Another
owner asking for a session id gets the same answer as for an id that never existed.

A session that paused (``session_pause``, or by itself at its idle timeout with
``on_idle="pause"``) leaves the registry, but its staged inline inputs stay (:meth:`kept_inputs`)
until it is resumed here, since a resume reads them again; they go at the server's shutdown.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass

from sandcell.errors import ConfigError
from sandcell.mcp.inputs import StagedInputs
from sandcell.sessions import Session, SessionEnd, SessionEnded


@dataclass(frozen=True, slots=True)
class _Entry:
    session: Session
    owner: Hashable
    inputs: StagedInputs


class McpSessions:
    """Live sessions by id; thread-safe (tool calls run on worker threads)."""

    def __init__(self, *, max_per_owner: int) -> None:
        self.max_per_owner = max_per_owner
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._paused_inputs: dict[str, StagedInputs] = {}
        """Inputs of sessions that paused, by session id, for their resume."""

    def check_room(self, owner: Hashable, *, adding: int = 1) -> None:
        """Refuse ``adding`` more sessions for ``owner`` when it would hold more than it may."""
        self._sweep()
        with self._lock:
            count = sum(1 for e in self._entries.values() if e.owner == owner)
        if count + adding > self.max_per_owner:
            raise ConfigError(
                f"this client has {count} open sessions and may hold {self.max_per_owner}; "
                "close one with session_close (or pause it with session_pause) first"
            )

    def add(self, session: Session, owner: Hashable, inputs: StagedInputs) -> None:
        with self._lock:
            self._entries[session.id] = _Entry(session, owner, inputs)

    def kept_inputs(self, session_id: str) -> StagedInputs:
        """The staged inputs a paused session left, handed to its resumed session (none: an
        empty set, its inputs are host paths or it had none)."""
        with self._lock:
            return self._paused_inputs.pop(session_id, None) or StagedInputs((), None)

    def forget(self, session_id: str) -> None:
        """Drop a session that ended (paused: its inputs are kept for the resume)."""
        self._drop(session_id)

    def get(self, session_id: str, owner: Hashable) -> Session:
        """The live session ``session_id`` of ``owner``; raises SessionEnded (an error that says
        to open a new session) when it is unknown, another owner's or over."""
        with self._lock:
            entry = self._entries.get(session_id)
        if entry is None or entry.owner != owner:
            raise SessionEnded(
                f"no open session {session_id!r} for this client (never opened here, closed, or "
                "ended when its connection closed); open one with session_open"
            )
        if entry.session.ended is not None:
            self._drop(session_id)
            raise SessionEnded(
                f"session {session_id} has ended ({entry.session.ended}); open a new one with "
                "session_open"
            )
        return entry.session

    def close(self, session_id: str, owner: Hashable) -> SessionEnd:
        session = self.get(session_id, owner)
        try:
            return session.close()
        finally:
            self._drop(session_id)

    def close_owned(self, owner: Hashable) -> int:
        """Close every session of ``owner`` (its connection ended); returns how many."""
        with self._lock:
            ids = [sid for sid, e in self._entries.items() if e.owner == owner]
        for sid in ids:
            self._close_quietly(sid)
        return len(ids)

    def close_all(self) -> int:
        with self._lock:
            ids = list(self._entries)
        for sid in ids:
            self._close_quietly(sid)
        with self._lock:
            kept, self._paused_inputs = list(self._paused_inputs.values()), {}
        for inputs in kept:
            inputs.close()
        return len(ids)

    def live_ids(self) -> list[str]:
        self._sweep()
        with self._lock:
            return sorted(self._entries)

    def _close_quietly(self, session_id: str) -> None:
        with self._lock:
            entry = self._entries.get(session_id)
        if entry is None:
            return
        try:
            entry.session.close()
        finally:
            self._drop(session_id)

    def _sweep(self) -> None:
        """Forget sessions that ended on their own (idle or lifetime limit)."""
        with self._lock:
            ended = [sid for sid, e in self._entries.items() if e.session.ended is not None]
        for sid in ended:
            self._drop(sid)

    def _drop(self, session_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(session_id, None)
            if entry is not None and entry.session.ended == "paused":
                self._paused_inputs[session_id] = entry.inputs
                return
        if entry is not None:
            entry.inputs.close()
