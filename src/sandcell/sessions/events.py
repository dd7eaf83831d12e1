"""A session's lasting events in the audit chain: pause, resume, snapshot, fork, start from a
snapshot.

Each is one entry of the same hash chain as the runs (:mod:`sandcell.audit`), so the order of
cells and of what happened to their session is one verifiable history. An event entry has a
``run_id`` of its own (the chain's key), ``kind: "session_event"`` and ``language: "session"``
so that listings tell it from a run, ``outcome: "ok"`` (an event that failed raises instead and
is not recorded), the session it is about, the state it wrote or came back from (its id, kind,
mode and :attr:`~sandcell.sessions.states.StoredState.digest`), who asked (``by``), and the
links: ``parent_session_id`` for a fork or a session started from a snapshot, and
``saved_by_record`` for a resume (the pause's entry).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from sandcell.audit import AuditEntry

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.sessions.states import StoredState

Event = Literal["pause", "resume", "snapshot", "fork", "start_from_snapshot"]

EVENT_RECORD_VERSION = 1


def record_event(
    executor: Executor,
    event: Event,
    *,
    session_id: str,
    profile: str,
    backend: str,
    state: StoredState,
    started_at: str,
    by: str | None,
    parent_session_id: str | None = None,
    children: Sequence[str] = (),
) -> AuditEntry:
    """Append one session event to the executor's audit chain (see the module docstring)."""
    now = dt.datetime.now(dt.UTC)
    began = dt.datetime.fromisoformat(started_at)
    return executor.audit.append(
        {
            "run_id": uuid.uuid4().hex,
            "kind": "session_event",
            "event": event,
            "language": "session",
            "code": "",
            "outcome": "ok",
            "reason": f"session {event}",
            "session_id": session_id,
            "parent_session_id": parent_session_id,
            "children": list(children),
            "profile": profile,
            "backend": {"name": backend},
            "state": {
                "id": state.id,
                "kind": state.kind,
                "name": state.name,
                "mode": state.saved.mode.value,
                "sha256": state.digest,
                "stored_bytes": state.stored_bytes,
                "cells": state.cells,
            },
            "saved_by_record": state.record if event == "resume" else None,
            "by": by,
            "started_at": started_at,
            "finished_at": now.isoformat(timespec="microseconds"),
            "usage": {
                "wall_ms": (now - began).total_seconds() * 1000,
                "cpu_ms": None,
                "peak_memory_bytes": None,
            },
            "record_version": EVENT_RECORD_VERSION,
        }
    )


__all__ = ["EVENT_RECORD_VERSION", "Event", "record_event"]
