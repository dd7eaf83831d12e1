"""Runs that wait for a person: the approval queue, one SQLite file.

A run the policy holds for approval is stored as a *ticket*: the request, the findings, the profile
and why. A person reads it (:func:`render_ticket`) and approves or denies.
:meth:`ApprovalStore.approve` returns the request rebuilt from the store after checking it is
exactly what was submitted (the code against ``code_sha256``, the whole request against
``request_sha256``); the caller runs it, calls :meth:`ApprovalStore.mark_ran` and puts
:func:`approval_record` into the run record. States:
``pending`` → ``approved`` → ``ran``, or ``pending`` → ``denied``; each change is one ``BEGIN
IMMEDIATE`` transaction that re-reads the state under the write lock, so of two racing approvers
(threads or processes) exactly one wins.

The whole request is stored, **environment variable values and stdin included**, because the
approved run must be the submitted run. The file is 0600 in a 0700 directory; still, pass no secrets
in ``env`` (give the code a host-side tool instead). The hashes catch a request edited after
submission; whoever can write the file can rewrite them too, so its permissions are the protection.

The same file keeps *tool tickets* (:mod:`sandcell.policy.tool_tickets`): a governed tool call a
run is waiting on, decided with :meth:`ApprovalStore.approve_tool` and
:meth:`ApprovalStore.deny_tool`. The two kinds never mix: each method finds only its own kind and
names the other when given its id.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import os
import pwd
import secrets
import socket
import sqlite3
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import platformdirs

from sandcell._sqlite import PrivateStore, StoreConnection
from sandcell.errors import ConfigError
from sandcell.policy.tool_tickets import (
    ARGS_JSON_COLUMN,
    TOOL_SCHEMA,
    TOOL_STATUSES,
    ToolTicket,
    args_preview,
    canonical_args,
    deadline,
    is_tool_ticket_id,
    new_tool_ticket_id,
    now_utc,
    past,
)
from sandcell.policy.tool_tickets import (
    COLUMNS as _TOOL_COLUMNS,
)
from sandcell.policy.tool_tickets import (
    ID_PREFIX as _TOOL_PREFIX,
)
from sandcell.spec import InputFile, IsolationMode, Language, Limits, RunRequest

__all__ = [
    "MIN_PREFIX",
    "STATUSES",
    "TOOL_STATUSES",
    "ApprovalError",
    "ApprovalStore",
    "ApprovedRun",
    "Ticket",
    "ToolTicket",
    "approval_record",
    "default_approvals_path",
    "default_approver",
    "render_list",
    "render_ticket",
    "request_from_dict",
    "request_to_dict",
]

STATUSES = ("pending", "approved", "denied", "ran")
MIN_PREFIX = 6
"""Shortest id prefix accepted in place of a full ticket id."""
_BATCH = 500
"""Ids per ``IN (...)`` of one statement (SQLite's limit on bound parameters is far above)."""

_T = TypeVar("_T")
_APPLICATION_ID = int.from_bytes(b"sndq", "big")  # tells our file from any other SQLite file
_SCHEMA = """CREATE TABLE approvals (id TEXT PRIMARY KEY, created_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'ran')),
    request TEXT NOT NULL, code_sha256 TEXT NOT NULL, request_sha256 TEXT NOT NULL,
    profile TEXT NOT NULL, findings TEXT NOT NULL, reason_for_approval TEXT NOT NULL,
    decided_by TEXT, decided_at TEXT, decision_reason TEXT, run_id TEXT)"""


class ApprovalError(ConfigError):
    """A ticket is unknown, ambiguous, in the wrong state, or its stored request was changed."""


# --- serialisation ----------------------------------------------------------------------------


def request_to_dict(req: RunRequest) -> dict[str, object]:
    """The JSON form of ``req``, complete (env values and stdin too) so it can be re-run exactly."""
    return {
        "code": req.code,
        "language": req.language,
        "inputs": [{"host_path": str(i.host_path), "name": i.name} for i in req.inputs],
        "exports": list(req.exports),
        "limits": None
        if req.limits is None
        else {f.name: getattr(req.limits, f.name) for f in fields(Limits)},
        "stdin_b64": base64.b64encode(req.stdin).decode("ascii"),
        "env": dict(req.env),
        "mode": req.mode.value,
        "landlock": req.landlock,
        "display": req.display,
        # Only when set: a request stored before runtimes existed keeps its hash.
        **({"runtime": req.runtime} if req.runtime is not None else {}),
    }


def _field(d: Mapping[str, object], key: str, kind: type[_T]) -> _T:
    value = d[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key} should be {kind.__name__}, not {type(value).__name__}")
    return value


def request_from_dict(d: Mapping[str, object]) -> RunRequest:
    """Inverse of :func:`request_to_dict`; a malformed dict raises :class:`ApprovalError`.

    A limit missing from ``d`` takes its default (it did not exist when the request was stored);
    an unknown one is refused, since it could not be honoured.
    """
    try:
        limits = None if d.get("limits", {}) is None else _field(d, "limits", dict)
        unknown = set(limits or {}) - {f.name for f in fields(Limits)}
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}")
        landlock = d["landlock"]
        if landlock is not None and not isinstance(landlock, bool):
            raise TypeError("landlock should be true, false or null")
        env = _field(d, "env", dict)
        exports = _field(d, "exports", list)
        display = d.get("display", False)  # absent in requests stored before display existed
        if not isinstance(display, bool):
            raise TypeError("display should be true or false")
        if not all(isinstance(v, str) for v in [*env.values(), *env, *exports]):
            raise TypeError("env and exports must hold strings")
        runtime = d.get("runtime")  # absent in requests stored before runtimes existed
        if runtime is not None and not isinstance(runtime, str):
            raise TypeError("runtime should be a string or null")
        return RunRequest(
            code=_field(d, "code", str),
            language=cast(Language, _field(d, "language", str)),
            inputs=tuple(
                InputFile(host_path=Path(_field(i, "host_path", str)), name=_field(i, "name", str))
                for i in _field(d, "inputs", list)
            ),
            exports=tuple(exports),
            limits=None if limits is None else Limits(**cast(dict[str, Any], limits)),
            stdin=base64.b64decode(_field(d, "stdin_b64", str), validate=True),
            env=env,
            mode=IsolationMode(_field(d, "mode", str)),
            landlock=landlock,
            display=display,
            runtime=runtime,
        )
    except (KeyError, TypeError, ValueError) as e:  # ConfigError and binascii.Error are ValueErrors
        raise ApprovalError(f"the stored request is malformed: {e}") from e


def _canonical(value: object) -> str:
    # ensure_ascii: lone surrogates (legal in a Python str) survive SQLite's UTF-8 as escapes.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(text: str) -> str:
    # surrogatepass: never fails; for valid text it equals the executor's code.encode() hash.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- tickets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """One stored request and where it stands; the columns of its row, parsed."""

    id: str
    created_at: str
    status: str
    request: RunRequest
    code_sha256: str
    request_sha256: str
    profile: dict[str, object]
    """``name``, ``source`` and ``sha256`` of the profile that required approval."""
    findings: tuple[dict[str, object], ...]
    reason_for_approval: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    run_id: str | None
    intact: bool
    declared: Mapping[str, object] | None = None
    """The result the caller declared (schema, textual invariants, result file), stored with
    the request and covered by its hash, so the approved run is validated the same way."""
    """False when the stored request no longer matches its hashes (it will not be approved)."""

    def to_dict(self) -> dict[str, object]:
        """JSON form for ``--json`` output; the request in full, env values included."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["request"] = request_to_dict(self.request)
        d["findings"] = list(self.findings)
        return d


# The columns are the Ticket's fields, in order, except the computed ``intact`` and ``declared``.
_NAMES = tuple(f.name for f in fields(Ticket))[:-2]
_SELECT = f"SELECT {', '.join(_NAMES)} FROM approvals"  # noqa: S608 (constant column names)
_TOOL_SELECT = f"SELECT {', '.join(_TOOL_COLUMNS)} FROM tool_approvals"  # noqa: S608 (constants)
_FIRST_FROM = {
    table: f"SELECT id FROM {table} WHERE id >= ? ORDER BY id LIMIT 1"  # noqa: S608 (constants)
    for table in ("approvals", "tool_approvals")
}


@dataclass(frozen=True, slots=True)
class ApprovedRun:
    """What :meth:`ApprovalStore.approve` returns: the ticket and the verified request to run."""

    ticket: Ticket
    request: RunRequest


def approval_record(ticket: Ticket) -> dict[str, object]:
    """The approval fields of the run record of an approved (or ran) ticket."""
    if ticket.status not in ("approved", "ran"):
        raise ApprovalError(f"approval {ticket.id} is {ticket.status}, not approved")
    return {
        "approval_id": ticket.id,
        "approved_by": ticket.decided_by,
        "approved_at": ticket.decided_at,
        "decision_reason": ticket.decision_reason,
        "requested_because": ticket.reason_for_approval,
    }


def default_approvals_path() -> Path:
    """``$SANDCELL_HOME/approvals.sqlite3``, else in the per-user data directory (like audit)."""
    home = os.environ.get("SANDCELL_HOME")
    base = Path(home).expanduser() if home else platformdirs.user_data_path("sandcell")
    return base / "approvals.sqlite3"


def default_approver() -> str:
    """Who approves from the CLI: ``$SANDCELL_APPROVER``, else ``user@hostname``."""
    if override := os.environ.get("SANDCELL_APPROVER", "").strip():
        return override
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _required(value: str, what: str) -> str:
    if not value.strip():
        raise ApprovalError(f"{what} must not be empty")
    return value.strip()


def _add_tool_table(conn: sqlite3.Connection) -> None:
    conn.execute(TOOL_SCHEMA)
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(tool_approvals)")}
    if "args_json" not in columns:
        conn.execute(ARGS_JSON_COLUMN)


# --- the store --------------------------------------------------------------------------------


class ApprovalStore(PrivateStore):
    """The approval queue in one SQLite file; safe to share between threads and processes."""

    _error = ApprovalError
    _what = "approval store"
    _pg_schema = "sandcell_approvals"

    def __init__(self, path: Path) -> None:
        """Open (creating file 0600, parents 0700, schema) the store at ``path``."""
        super().__init__(
            path,
            application_id=_APPLICATION_ID,
            schema=(_SCHEMA, TOOL_SCHEMA),
            # A store made before tool tickets existed gets their table on first open.
            check=_add_tool_table,
        )

    def submit(
        self,
        request: RunRequest,
        *,
        profile: Mapping[str, object],
        findings: Sequence[Mapping[str, object]],
        why: str,
        declared: Mapping[str, object] | None = None,
    ) -> Ticket:
        """Store ``request`` as a pending ticket; ``why`` says why it needs approval.

        ``declared`` (JSON) is stored inside the request, under its hash.
        """
        stored = request_to_dict(request)
        if declared:
            stored["declared"] = dict(declared)
        req = _canonical(stored)
        try:
            row = (
                secrets.token_hex(6),
                _now(),
                "pending",
                req,
                _sha256(request.code),
                _sha256(req),
                _canonical(dict(profile)),
                _canonical([dict(f) for f in findings]),
                _required(why, "the reason the run needs approval"),
            )
        except (TypeError, ValueError) as e:
            raise ApprovalError(f"profile or findings are not JSON-serialisable: {e}") from e
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO approvals (id, created_at, status, request, code_sha256, "
                "request_sha256, profile, findings, reason_for_approval) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return self._ticket(self._find(conn, row[0]))

    def get(self, id_or_prefix: str) -> Ticket:
        """The ticket with this id, or the only one starting with it (≥ MIN_PREFIX chars)."""
        with self._txn(write=False) as conn:
            return self._ticket(self._find(conn, id_or_prefix))

    def list(self, status: str | None = "pending", limit: int = 50) -> builtins.list[Ticket]:
        """Up to ``limit`` tickets in ``status`` (any status for ``None``), newest first."""
        if status is not None and status not in STATUSES:
            raise ApprovalError(f"unknown status {status!r}; choose one of {', '.join(STATUSES)}")
        where = "" if status is None else " WHERE status = ?"
        with self._txn(write=False) as conn:
            order = " ORDER BY created_at DESC, rowid DESC LIMIT ?"
            args = (*([status] if status else []), max(limit, 0))
            rows = conn.execute(_SELECT + where + order, args).fetchall()
            return [self._ticket(r) for r in rows]

    def get_many(self, ids: Sequence[str]) -> dict[str, Ticket]:
        """The tickets with exactly these ids (no prefixes), in one read; missing ids are left
        out."""
        found: dict[str, Ticket] = {}
        with self._txn(write=False) as conn:
            for start in range(0, len(ids), _BATCH):
                batch = list(ids[start : start + _BATCH])
                marks = ", ".join("?" * len(batch))
                rows = conn.execute(f"{_SELECT} WHERE id IN ({marks})", batch).fetchall()
                for row in rows:
                    ticket = self._ticket(row)
                    found[ticket.id] = ticket
        return found

    def approve(self, id_or_prefix: str, *, by: str, reason: str = "") -> ApprovedRun:
        """Approve a pending ticket; the returned request is verified against the stored hashes."""
        by = _required(by, "the approver (by)")
        with self._txn() as conn:
            ticket = self._ticket(self._find(conn, id_or_prefix))
            self._expect(ticket, "pending", "approved")
            if not ticket.intact:
                raise ApprovalError(
                    f"the request of approval {ticket.id} no longer matches its hash: it was "
                    "changed after it was submitted; refusing to run it"
                )
            ticket = self._update(conn, ticket.id, "approved", by, reason.strip() or None)
        return ApprovedRun(ticket, ticket.request)

    def deny(self, id_or_prefix: str, *, by: str, reason: str) -> Ticket:
        """Deny a pending ticket; the reason is required (it is what the requester reads)."""
        by = _required(by, "the approver (by)")
        reason = _required(reason, "the reason for denying")
        with self._txn() as conn:
            ticket = self._ticket(self._find(conn, id_or_prefix))
            self._expect(ticket, "pending", "denied")
            return self._update(conn, ticket.id, "denied", by, reason)

    def reopen(self, id_or_prefix: str) -> Ticket:
        """Put an approved ticket whose run could not start back to pending (approved → pending).

        The decision is cleared with it: nothing ran under it, and the ticket must be approvable
        again once the cause (an input gone, a backend unavailable) is fixed.
        """
        with self._txn() as conn:
            ticket = self._ticket(self._find(conn, id_or_prefix))
            self._expect(ticket, "approved", "reopened")
            conn.execute(
                "UPDATE approvals SET status = 'pending', decided_by = NULL, decided_at = NULL, "
                "decision_reason = NULL WHERE id = ?",
                (ticket.id,),
            )
            return self._ticket(self._find(conn, ticket.id))

    def mark_ran(self, id_or_prefix: str, run_id: str) -> Ticket:
        """Record that the approved ticket ran as ``run_id`` (approved → ran)."""
        run_id = _required(run_id, "run_id")
        with self._txn() as conn:
            ticket = self._ticket(self._find(conn, id_or_prefix))
            self._expect(ticket, "approved", "marked as ran")
            conn.execute(
                "UPDATE approvals SET status = 'ran', run_id = ? WHERE id = ?", (run_id, ticket.id)
            )
            return self._ticket(self._find(conn, ticket.id))

    # --- tool tickets ---------------------------------------------------------------------------

    def submit_tool(
        self,
        *,
        profile: str,
        tool: str,
        args: Mapping[str, object],
        expires_in_s: float,
        run_id: str | None = None,
    ) -> ToolTicket:
        """File a tool call as a pending tool ticket that expires after ``expires_in_s``; the
        arguments are kept in full (see :mod:`sandcell.policy.tool_tickets`)."""
        try:
            exact = canonical_args(args)
            preview, sha256, size = args_preview(args)
        except (TypeError, ValueError) as e:
            raise ApprovalError(f"the arguments of {tool} are not JSON: {e}") from e
        now = now_utc()
        row = (
            new_tool_ticket_id(),
            now.isoformat(timespec="microseconds"),
            deadline(now, expires_in_s),
            "pending",
            _required(profile, "the profile"),
            _required(tool, "the tool"),
            run_id,
            preview,
            sha256,
            size,
            exact,
        )
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO tool_approvals (id, created_at, expires_at, status, profile, tool, "
                "run_id, args_preview, args_sha256, args_bytes, args_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return self._tool_ticket(self._find_tool(conn, row[0]))

    def get_tool(self, id_or_prefix: str) -> ToolTicket:
        """The tool ticket with this id, or the only one starting with it (≥ MIN_PREFIX chars);
        a pending one past its deadline is expired first."""
        with self._txn() as conn:
            self._expire_overdue(conn)
            return self._tool_ticket(self._find_tool(conn, id_or_prefix))

    def list_tools(
        self, status: str | None = "pending", limit: int = 50
    ) -> builtins.list[ToolTicket]:
        """Up to ``limit`` tool tickets in ``status`` (any for ``None``), newest first."""
        return [t for _, t in self.tools_before(status, limit, before=None)]

    def tools_before(
        self, status: str | None, limit: int, *, before: int | None
    ) -> builtins.list[tuple[int, ToolTicket]]:
        """Up to ``limit`` tool tickets in ``status`` (any for ``None``), newest first, each
        with its position; with ``before`` (a position from an earlier call), only those
        filed before it: keyset paging, so tickets filed meanwhile never shift a page."""
        if status is not None and status not in TOOL_STATUSES:
            raise ApprovalError(
                f"unknown status {status!r}; choose one of {', '.join(TOOL_STATUSES)}"
            )
        where = [] if status is None else ["status = ?"]
        args: builtins.list[object] = [] if status is None else [status]
        if before is not None:
            where.append("rowid < ?")
            args.append(before)
        clause = " WHERE " + " AND ".join(where) if where else ""
        # rowid grows with every ticket filed (tickets are never deleted): filing order.
        select = _TOOL_SELECT.replace("SELECT ", "SELECT rowid, ", 1)
        with self._txn() as conn:
            self._expire_overdue(conn)
            rows = conn.execute(
                select + clause + " ORDER BY rowid DESC LIMIT ?", (*args, max(limit, 0))
            ).fetchall()
            return [(int(r[0]), self._tool_ticket(r[1:])) for r in rows]

    def approve_tool(self, id_or_prefix: str, *, by: str, reason: str = "") -> ToolTicket:
        """Approve a pending tool ticket (the waiting call then goes ahead)."""
        by = _required(by, "the approver (by)")
        return self._decide_tool(id_or_prefix, "approved", by, reason.strip() or None)

    def deny_tool(self, id_or_prefix: str, *, by: str, reason: str) -> ToolTicket:
        """Deny a pending tool ticket; the reason is required (the record keeps it)."""
        by = _required(by, "the approver (by)")
        return self._decide_tool(id_or_prefix, "denied", by, _required(reason, "the reason"))

    def expire_tool(self, id_: str, *, reason: str) -> ToolTicket:
        """Expire a tool ticket if it is still pending (pending → expired); a decided ticket is
        returned as it is, so whoever decided first wins."""
        with self._txn() as conn:
            ticket = self._tool_ticket(self._find_tool(conn, id_))
            if ticket.status != "pending":
                return ticket
            conn.execute(
                "UPDATE tool_approvals SET status = 'expired', decided_at = ?, reason = ? "
                "WHERE id = ? AND status = 'pending'",
                (now_utc().isoformat(timespec="microseconds"), reason, ticket.id),
            )
            return self._tool_ticket(self._find_tool(conn, ticket.id))

    def _decide_tool(
        self, id_or_prefix: str, status: str, by: str, reason: str | None
    ) -> ToolTicket:
        action = "approved" if status == "approved" else "denied"
        with self._txn() as conn:
            self._expire_overdue(conn)
            ticket = self._tool_ticket(self._find_tool(conn, id_or_prefix))
            if ticket.status != "pending":
                by_whom = f" by {ticket.decided_by}" if ticket.decided_by else ""
                when = f" at {ticket.decided_at}" if ticket.decided_at else ""
                why = f" ({ticket.reason})" if ticket.status == "expired" and ticket.reason else ""
                raise ApprovalError(
                    f"tool call approval {ticket.id} is {ticket.status}{by_whom}{when}{why}; "
                    f"only a pending one can be {action}"
                )
            conn.execute(
                "UPDATE tool_approvals SET status = ?, decided_by = ?, decided_at = ?, reason = ? "
                "WHERE id = ? AND status = 'pending'",
                (status, by, now_utc().isoformat(timespec="microseconds"), reason, ticket.id),
            )
            return self._tool_ticket(self._find_tool(conn, ticket.id))

    @staticmethod
    def _expire_overdue(conn: StoreConnection) -> None:
        """Pending tool tickets past their deadline become expired (their waiter may be gone)."""
        now = now_utc()
        rows = conn.execute(
            "SELECT id, expires_at FROM tool_approvals WHERE status = 'pending'"
        ).fetchall()
        for id_, expires_at in rows:
            if past(str(expires_at), now):
                conn.execute(
                    "UPDATE tool_approvals SET status = 'expired', decided_at = ?, reason = ? "
                    "WHERE id = ? AND status = 'pending'",
                    (
                        now.isoformat(timespec="microseconds"),
                        f"nobody decided before {expires_at}",
                        id_,
                    ),
                )

    def _find_tool(self, conn: StoreConnection, id_or_prefix: str) -> Any:
        key = id_or_prefix.strip().lower()
        if not is_tool_ticket_id(key) and self._exists(conn, "approvals", key):
            raise ApprovalError(
                f"approval {key!r} is a run waiting for approval, not a tool call; a run is "
                f"approved with ApprovalStore.approve (sandcell approve {key} runs it)"
            )
        row = conn.execute(_TOOL_SELECT + " WHERE id = ?", (key,)).fetchone()
        if row is not None:
            return row
        if len(key) >= MIN_PREFIX and is_tool_ticket_id(key):
            rows = conn.execute(
                _TOOL_SELECT + " WHERE id >= ? ORDER BY id LIMIT 6", (key,)
            ).fetchall()
            matches = [r for r in rows if str(r[0]).startswith(key)]
            if len(matches) == 1:
                return matches[0]
            if matches:
                shown = ", ".join(str(r[0]) for r in matches[:5])
                raise ApprovalError(
                    f"tool call approval id prefix {key!r} is ambiguous: it matches {shown}; "
                    "give more characters"
                )
        raise ApprovalError(
            f"no tool call approval {key!r} in {self.where}; tool call ids start with "
            f"{_TOOL_PREFIX!r}; give the full id or a unique prefix of at least {MIN_PREFIX} "
            "characters (see `sandcell approvals list`)"
        )

    @staticmethod
    def _exists(conn: StoreConnection, table: str, key: str) -> bool:
        """Whether ``table`` has the id ``key`` (or, from MIN_PREFIX characters, one starting
        with it): used to name the other kind of ticket when an id is given to the wrong one."""
        row = conn.execute(_FIRST_FROM[table], (key,)).fetchone()
        found = "" if row is None else str(row[0])
        return found == key or (len(key) >= MIN_PREFIX and found.startswith(key))

    def _tool_ticket(self, row: Any) -> ToolTicket:
        return ToolTicket.from_row(dict(zip(_TOOL_COLUMNS, row, strict=True)))

    # --- internals ----------------------------------------------------------------------------

    def _find(self, conn: StoreConnection, id_or_prefix: str) -> Any:
        key = id_or_prefix.strip().lower()
        row = conn.execute(_SELECT + " WHERE id = ?", (key,)).fetchone()
        if row is not None:
            return row
        if len(key) >= MIN_PREFIX:
            # ids sort bytewise, so every id with this prefix comes right after it: a range scan.
            rows = conn.execute(_SELECT + " WHERE id >= ? ORDER BY id LIMIT 6", (key,)).fetchall()
            matches = [r for r in rows if str(r[0]).startswith(key)]
            if len(matches) == 1:
                return matches[0]
            if matches:
                shown = ", ".join(str(r[0]) for r in matches[:5])
                raise ApprovalError(
                    f"approval id prefix {key!r} is ambiguous: it matches {shown}; give more "
                    "characters"
                )
        if is_tool_ticket_id(key) and self._exists(conn, "tool_approvals", key):
            raise ApprovalError(
                f"approval {key!r} is a tool call a run is waiting on, not a run; it is decided "
                f"with ApprovalStore.approve_tool or deny_tool (sandcell approve {key})"
            )
        raise ApprovalError(
            f"no approval {key!r} in {self.where}; give the full id or a unique prefix of at least "
            f"{MIN_PREFIX} characters (see `sandcell approvals list`)"
        )

    def _ticket(self, row: Any) -> Ticket:
        col = dict(zip(_NAMES, row, strict=True))
        try:
            request = request_from_dict(json.loads(col["request"]))
            profile, findings = json.loads(col["profile"]), json.loads(col["findings"])
        except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
            raise ApprovalError(
                f"approval {col['id']} in {self.where} is corrupt ({e}): edited outside sandcell"
            ) from e
        # Both hashes: the code is what the approver reads, but inputs, env and limits are as
        # much a part of "the same run".
        intact = (_sha256(request.code), _sha256(col["request"])) == (
            col["code_sha256"],
            col["request_sha256"],
        )
        declared = json.loads(col["request"]).get("declared")
        col.update(
            request=request,
            profile=profile,
            findings=tuple(findings),
            intact=intact,
            declared=declared if isinstance(declared, dict) else None,
        )
        return Ticket(**col)

    @staticmethod
    def _expect(ticket: Ticket, status: str, action: str) -> None:
        if ticket.status != status:
            by = f" by {ticket.decided_by} at {ticket.decided_at}" if ticket.decided_by else ""
            article = "an" if status[0] in "aeiou" else "a"
            raise ApprovalError(
                f"approval {ticket.id} is {ticket.status}{by}; only {article} {status} ticket "
                f"can be {action}"
            )

    def _update(
        self, conn: StoreConnection, id_: str, status: str, by: str, reason: str | None
    ) -> Ticket:
        conn.execute(
            "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?, decision_reason = ? "
            "WHERE id = ?",
            (status, by, _now(), reason, id_),
        )
        return self._ticket(self._find(conn, id_))


# --- rendering --------------------------------------------------------------------------------


def _visible(text: str) -> str:
    """One line of ``text`` safe for a terminal: control (ESC, C0, C1, newlines), format (bidi
    overrides, zero-width) and separator characters become visible escapes such as ``\\x1b`` or
    ``\\u202e``, so what the approver reads is what runs. Tabs are kept."""
    return "".join(
        ch
        if ch == "\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp")
        else ascii(ch)[1:-1]
        for ch in text
    )


def _finding_line(f: Mapping[str, object]) -> str:
    where = f"{f.get('line', '?')}:{f.get('column', '?')}"
    text = f"{f.get('rule_id', '?')} {f.get('severity', '?')} {where} {f.get('message', '')}"
    return _visible(text.strip())


def render_ticket(ticket: Ticket) -> str:
    """The full text of ``sandcell approvals show``: metadata, findings and numbered code."""
    req, p = ticket.request, ticket.profile
    lines = [
        f"approval  {ticket.id}  {ticket.status}",
        f"created   {ticket.created_at}",
        f"profile   {p.get('name', '?')} ({p.get('source', '?')}, sha256 {p.get('sha256', '?')})",
        f"why       {ticket.reason_for_approval}",
        f"language  {req.language}   mode {req.mode.value}   landlock "
        f"{'default' if req.landlock is None else req.landlock}",
        # The rung is part of what is approved: the run happens on it or not at all.
        f"backend   {p.get('backend') or 'not recorded (the profile default when approved)'}",
        "limits    "
        + ", ".join(f"{f.name}={getattr(req.effective_limits, f.name)}" for f in fields(Limits)),
    ]
    lines += [f"input     {i.name} <- {i.host_path}" for i in req.inputs]
    lines += [f"export    {g}" for g in req.exports]
    lines += [f"env       {k}={v}" for k, v in sorted(req.env.items())]
    if req.stdin:
        lines.append(f"stdin     {len(req.stdin)} bytes")
    if ticket.decided_by:
        lines.append(f"decided   {ticket.status} by {ticket.decided_by} at {ticket.decided_at}")
        lines.append(f"reason    {ticket.decision_reason or '-'}")
    if ticket.run_id:
        lines.append(f"run       {ticket.run_id}")
    if not ticket.intact:
        lines.append("WARNING   the stored request was changed after submission; it cannot run")
    lines = [_visible(line) for line in lines]
    lines.append(f"findings ({len(ticket.findings)})" if ticket.findings else "no findings")
    lines += ["  " + _finding_line(f) for f in ticket.findings]
    code = req.code[:-1] if req.code.endswith("\n") else req.code
    # Split on \n only: a \r stays on its line as a visible escape instead of moving the numbers.
    code_lines = code.split("\n")
    width = len(str(len(code_lines)))
    lines.append(f"code (sha256 {ticket.code_sha256})")
    lines += [f"{n:>{width}} | {_visible(c)}" for n, c in enumerate(code_lines, 1)]
    return "\n".join(lines) + "\n"


def render_list(tickets: Sequence[Ticket]) -> str:
    """One line per ticket for ``sandcell approvals list``."""
    if not tickets:
        return "no approvals\n"
    out = []
    for t in tickets:
        first = _finding_line(t.findings[0])[:72] if t.findings else "no findings"
        more = f" (+{len(t.findings) - 1} more)" if len(t.findings) > 1 else ""
        created = t.created_at[:19].replace("T", " ")
        out.append(f"{t.id}  {created}  {t.request.language:<6}  {t.status:<8}  {first}{more}")
    return "\n".join(out) + "\n"
