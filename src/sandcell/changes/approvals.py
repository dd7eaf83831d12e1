"""Approvals of change sets, each bound to one run and the exact hash of its change set.

An approval is a row of its own store (``change_approvals.sqlite3`` next to the approval
queue): who decided, when, for which run and which ``changes.json`` hash. Applying consumes it in
the same transaction that checks it, so one approval applies one change set once; a later apply
needs a new approval. Ids start with ``c`` and are random, so an id cannot be guessed or taken
for a run ticket (hexadecimal) or a tool ticket (``t``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandcell._sqlite import PrivateStore
from sandcell.errors import ConfigError

_APPLICATION_ID = int.from_bytes(b"sndx", "big")
_SCHEMA = """CREATE TABLE change_approvals (id TEXT PRIMARY KEY, run_id TEXT NOT NULL,
    changeset_sha256 TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('approved', 'denied', 'consumed')),
    decided_by TEXT NOT NULL, decided_at TEXT NOT NULL, reason TEXT NOT NULL,
    consumed_at TEXT, applied_to TEXT)"""
FILENAME = "change_approvals.sqlite3"


class ChangeApprovalError(ConfigError):
    """A change approval that does not exist, does not fit, or was already used."""


@dataclass(frozen=True, slots=True)
class ChangeApproval:
    id: str
    run_id: str
    changeset_sha256: str
    status: str
    decided_by: str
    decided_at: str
    reason: str
    consumed_at: str | None
    applied_to: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "changeset_sha256": self.changeset_sha256,
            "status": self.status,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at,
            "reason": self.reason,
            "consumed_at": self.consumed_at,
            "applied_to": self.applied_to,
        }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ChangeApprovals(PrivateStore):
    _error = ChangeApprovalError
    _what = "change approval store"
    _pg_schema = "sandcell_changes"

    def __init__(self, path: Path) -> None:
        super().__init__(path, application_id=_APPLICATION_ID, schema=(_SCHEMA,))

    def decide(
        self, run_id: str, changeset_sha256: str, *, approve: bool, by: str, reason: str = ""
    ) -> ChangeApproval:
        """Record a decision on run ``run_id``'s change set with this hash."""
        if not by.strip():
            raise ChangeApprovalError("who decides must not be empty")
        row = (
            "c" + secrets.token_hex(16),
            run_id,
            changeset_sha256,
            "approved" if approve else "denied",
            by.strip(),
            _now(),
            reason,
        )
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO change_approvals (id, run_id, changeset_sha256, status, decided_by,"
                " decided_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return self._one(conn, row[0])

    def latest(self, run_id: str, changeset_sha256: str) -> ChangeApproval | None:
        """The newest decision on this change set, if any."""
        with self._txn(write=False) as conn:
            found = conn.execute(
                "SELECT * FROM change_approvals WHERE run_id = ? AND changeset_sha256 = ? "
                "ORDER BY decided_at DESC LIMIT 1",
                (run_id, changeset_sha256),
            ).fetchone()
            return None if found is None else self._row(found)

    def list(self, run_id: str | None = None) -> list[ChangeApproval]:
        with self._txn(write=False) as conn:
            rows = conn.execute(
                "SELECT * FROM change_approvals WHERE CAST(? AS TEXT) IS NULL OR run_id = ? "
                "ORDER BY decided_at DESC LIMIT 100",
                (run_id, run_id),
            ).fetchall()
            return [self._row(r) for r in rows]

    def consume(
        self, approval_id: str, *, run_id: str, changeset_sha256: str, target: str
    ) -> ChangeApproval:
        """Check ``approval_id`` fits this run's change set with this hash and is unused, and
        mark it used, atomically; ChangeApprovalError saying why not."""
        with self._txn() as conn:
            found = conn.execute(
                "SELECT * FROM change_approvals WHERE id = ?", (approval_id,)
            ).fetchone()
            if found is None:
                raise ChangeApprovalError(
                    f"no change approval {approval_id!r}: it was never given (ids are exact); "
                    f"approve with: sandcell changes approve {run_id}"
                )
            a = self._row(found)
            if a.run_id != run_id:
                raise ChangeApprovalError(
                    f"approval {a.id} is for run {a.run_id}, not run {run_id}"
                )
            if a.changeset_sha256 != changeset_sha256:
                raise ChangeApprovalError(
                    f"approval {a.id} is for change set {a.changeset_sha256[:16]}…, but run "
                    f"{run_id}'s change set is {changeset_sha256[:16]}…: it approves another "
                    "diff; approve this one"
                )
            if a.status == "denied":
                raise ChangeApprovalError(
                    f"change set of run {run_id} was denied by {a.decided_by}"
                )
            later = conn.execute(
                "SELECT decided_by FROM change_approvals WHERE run_id = ? AND "
                "changeset_sha256 = ? AND status = 'denied' AND decided_at > ? LIMIT 1",
                (run_id, changeset_sha256, a.decided_at),
            ).fetchone()
            if later is not None and a.status == "approved":
                raise ChangeApprovalError(
                    f"approval {a.id} was overruled: {later[0]} denied this change set later"
                )
            if a.status == "consumed":
                raise ChangeApprovalError(
                    f"approval {a.id} was already used (applied to {a.applied_to} at "
                    f"{a.consumed_at}); an approval applies once: approve again"
                )
            conn.execute(
                "UPDATE change_approvals SET status = 'consumed', consumed_at = ?, applied_to = ?"
                " WHERE id = ? AND status = 'approved'",
                (_now(), target, a.id),
            )
            return self._one(conn, a.id)

    def _one(self, conn: Any, id_: str) -> ChangeApproval:
        return self._row(
            conn.execute("SELECT * FROM change_approvals WHERE id = ?", (id_,)).fetchone()
        )

    @staticmethod
    def _row(r: Any) -> ChangeApproval:
        return ChangeApproval(*r)
