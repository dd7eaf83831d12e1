"""Conversations waiting for a person: the agent's state, kept with the approval it waits for.

When a run of the agent is held for approval and nobody can approve it now, the agent stops with
``awaiting_approval`` and stores its whole conversation here, under the approval's id: the
question, inputs, exports, limits and declared result, the messages, attempts and events so far,
the budget and what was spent of it, and the model's settings (never a key). After ``sandcell
approve ID`` (which runs the held program and records its result) or ``sandcell deny ID``,
``sandcell ask --resume ID`` (:meth:`sandcell.agent.Agent.resume`) picks the conversation up
from the approved run's result, or stops it as ``approval_denied``.

One SQLite file next to the approval store (``agent.sqlite3`` in the sandcell home), private
like it (0600 in a 0700 directory: the messages hold the inputs' samples and the runs' output).
A conversation is resumed once: ``waiting`` → ``resumed`` in one ``BEGIN IMMEDIATE``
transaction, so of two racing resumes exactly one gets it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandcell._sqlite import PrivateStore, StoreConnection
from sandcell.errors import ConfigError

__all__ = ["PAUSED_FILENAME", "Paused", "PausedStore", "ResumeError"]

PAUSED_FILENAME = "agent.sqlite3"
_APPLICATION_ID = int.from_bytes(b"sndg", "big")  # tells our file from any other SQLite file
_SCHEMA = """CREATE TABLE paused (approval_id TEXT PRIMARY KEY, created_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('waiting', 'resumed')),
    state TEXT NOT NULL, resumed_at TEXT)"""


class ResumeError(ConfigError):
    """A conversation cannot be resumed: unknown, not yet decided, or already resumed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Paused:
    """One stored conversation."""

    approval_id: str
    created_at: str
    status: str
    """``waiting`` until it is resumed, then ``resumed``."""
    state: Mapping[str, object]
    """The agent's state (see :mod:`sandcell.agent._task`)."""
    resumed_at: str | None = None

    @property
    def steps(self) -> int:
        """Model turns the conversation has had (a scripted model skips that many)."""
        spent = self.state.get("spent")
        steps = spent.get("steps") if isinstance(spent, Mapping) else None
        return steps if isinstance(steps, int) else 0

    @property
    def model_settings(self) -> Mapping[str, object]:
        """How the model was configured (name, provider, base URL, key variable; no key)."""
        settings = self.state.get("model_settings")
        return settings if isinstance(settings, Mapping) else {}

    @property
    def question(self) -> str:
        return str(self.state.get("question", ""))

    def ensure_waiting(self) -> None:
        """Raise ResumeError when the conversation was already resumed."""
        if self.status != "waiting":
            raise _already(self)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class PausedStore(PrivateStore):
    """The paused conversations in one SQLite file; safe to share between threads and processes."""

    _error = ResumeError
    _what = "agent conversation store"
    _pg_schema = "sandcell_agent"

    def __init__(self, path: Path) -> None:
        super().__init__(path, application_id=_APPLICATION_ID, schema=(_SCHEMA,))

    def save(self, approval_id: str, state: Mapping[str, object]) -> Paused:
        """Keep ``state`` as the conversation waiting for ``approval_id``."""
        try:
            text = json.dumps(dict(state), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ResumeError(f"the conversation cannot be stored as JSON: {exc}") from exc
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO paused (approval_id, created_at, status, state) "
                "VALUES (?, ?, 'waiting', ?)",
                (approval_id, _now(), text),
            )
            return self._get(conn, approval_id)

    def get(self, approval_id: str) -> Paused:
        """The conversation waiting for ``approval_id``; ResumeError if there is none."""
        with self._txn(write=False) as conn:
            return self._get(conn, approval_id)

    def claim(self, approval_id: str) -> Paused:
        """Mark the conversation resumed and return it; ResumeError if it already was."""
        with self._txn() as conn:
            paused = self._get(conn, approval_id)
            paused.ensure_waiting()
            conn.execute(
                "UPDATE paused SET status = 'resumed', resumed_at = ? WHERE approval_id = ?",
                (_now(), paused.approval_id),
            )
            return self._get(conn, paused.approval_id)

    def _get(self, conn: StoreConnection, approval_id: str) -> Paused:
        key = approval_id.strip().lower()
        row: Any = conn.execute(
            "SELECT approval_id, created_at, status, state, resumed_at FROM paused "
            "WHERE approval_id = ?",
            (key,),
        ).fetchone()
        if row is None:
            raise ResumeError(
                f"no conversation waits for approval {key!r} in {self.where}: resume takes the "
                "approval id an `ask` stopped at (awaiting_approval), with the same SANDCELL_HOME"
            )
        try:
            state = json.loads(row[3])
        except ValueError as exc:
            raise ResumeError(
                f"the conversation of approval {key} in {self.where} is corrupt ({exc})"
            ) from exc
        if not isinstance(state, dict):
            raise ResumeError(f"the conversation of approval {key} in {self.where} is corrupt")
        return Paused(
            approval_id=row[0], created_at=row[1], status=row[2], state=state, resumed_at=row[4]
        )


def _already(paused: Paused) -> ResumeError:
    return ResumeError(
        f"the conversation of approval {paused.approval_id} was already resumed at "
        f"{paused.resumed_at}; a conversation is resumed once (ask the question again to start "
        "a new one)"
    )
