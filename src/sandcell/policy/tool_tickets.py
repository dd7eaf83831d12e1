"""Tool-call tickets: a governed tool call that waits for a person, as rows of the approval store.

A run's program calls a tool whose profile says ``approval = "always"``; the tool gateway asks
its approver, and the approval queue (:mod:`sandcell.tools.queue_approver`) files the call here as
a *tool ticket* and waits for someone to decide with ``sandcell approve ID`` or ``sandcell deny
ID``. A tool ticket is not a run ticket: it holds no program, only which tool the run wants to
call and with what. Its id starts with ``t`` (run tickets are hexadecimal), so an id can never be
taken for the other kind, and approving one kind through the other's command fails by name.

States: ``pending`` → ``approved`` | ``denied`` | ``expired``. A ticket expires when nobody
decided before its deadline (the run's wall time) or when its run ended first; an expired ticket
can no longer be approved, even if the process that waited for it was killed and nobody marked
it: a pending ticket past its ``expires_at`` is expired on the next look at the store.

The arguments are stored as a preview (secret-shaped tokens redacted, cut at
:data:`PREVIEW_CHARS`) and a SHA-256 of their canonical JSON, the same hash the call's record
carries (``args_sha256``), so a ticket and the call it let through can be matched in the audit.
"""

from __future__ import annotations

import json
import secrets
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from sandcell.tools.records import digest
from sandcell.validation.redact import Redactor

__all__ = [
    "ID_PREFIX",
    "PREVIEW_CHARS",
    "TOOL_SCHEMA",
    "TOOL_STATUSES",
    "ToolTicket",
    "args_preview",
    "is_tool_ticket_id",
    "new_tool_ticket_id",
    "render_tool_list_lines",
    "render_tool_ticket",
]

TOOL_STATUSES = ("pending", "approved", "denied", "expired")
ID_PREFIX = "t"
"""First character of every tool ticket id; run ticket ids are hexadecimal and never start so."""
PREVIEW_CHARS = 2000
"""How much of the arguments' JSON a ticket keeps to show (the hash covers all of it)."""

TOOL_SCHEMA = """CREATE TABLE IF NOT EXISTS tool_approvals (id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL, expires_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    profile TEXT NOT NULL, tool TEXT NOT NULL, run_id TEXT,
    args_preview TEXT NOT NULL, args_sha256 TEXT NOT NULL, args_bytes INTEGER NOT NULL,
    decided_by TEXT, decided_at TEXT, reason TEXT)"""
"""``IF NOT EXISTS``: also run on stores created before tool tickets existed."""

_REDACTOR = Redactor()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolTicket:
    """One tool call waiting for (or past) a person's decision; the columns of its row."""

    id: str
    created_at: str
    expires_at: str
    """After this (UTC, ISO 8601) the ticket can no longer be approved."""
    status: str
    profile: str
    """The name of the run's profile, whose ``[tools]`` asked for approval."""
    tool: str
    """``tool.operation`` as the gateway checked it."""
    run_id: str | None
    """The run that asked, when the caller knew it (a session's cells share one gateway)."""
    args_preview: str
    """The arguments as JSON, secret-shaped tokens redacted, cut at :data:`PREVIEW_CHARS`."""
    args_sha256: str
    """Of the arguments' canonical JSON: equal to the call record's ``args_sha256``."""
    args_bytes: int
    decided_by: str | None
    decided_at: str | None
    reason: str | None
    """The decider's reason, or why the ticket expired."""

    def to_dict(self) -> dict[str, object]:
        """JSON form for ``--json`` output (``kind`` tells it from a run ticket)."""
        return {"kind": "tool_call", **asdict(self)}


COLUMNS = (
    "id",
    "created_at",
    "expires_at",
    "status",
    "profile",
    "tool",
    "run_id",
    "args_preview",
    "args_sha256",
    "args_bytes",
    "decided_by",
    "decided_at",
    "reason",
)


def new_tool_ticket_id() -> str:
    return ID_PREFIX + secrets.token_hex(6)


def is_tool_ticket_id(text: str) -> bool:
    """Whether ``text`` (an id or a prefix of one) names a tool ticket rather than a run."""
    return text.strip().lower().startswith(ID_PREFIX)


def args_preview(args: Mapping[str, object]) -> tuple[str, str, int]:
    """``(preview, sha256, size)`` of a call's arguments (see :class:`ToolTicket`)."""
    text = json.dumps(dict(args), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8", "surrogatepass"))
    shown, _ = _REDACTOR.scan_text(text)
    if len(shown) > PREVIEW_CHARS:
        shown = shown[:PREVIEW_CHARS] + f"... ({len(shown) - PREVIEW_CHARS} more characters)"
    return shown, digest(dict(args)), size


def deadline(now: datetime, seconds: float) -> str:
    return (now + timedelta(seconds=max(seconds, 0.0))).isoformat(timespec="microseconds")


def now_utc() -> datetime:
    return datetime.now(UTC)


def past(expires_at: str, now: datetime) -> bool:
    try:
        return datetime.fromisoformat(expires_at) <= now
    except ValueError:
        return True  # an unreadable deadline has passed: fail closed


def _visible(text: str) -> str:
    # What the approver reads is what the program sent: control, format and line-separator
    # characters become visible escapes (arguments come from inside the sandbox).
    return "".join(
        ch
        if ch == "\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Zl", "Zp")
        else ascii(ch)[1:-1]
        for ch in text
    )


def render_tool_ticket(ticket: ToolTicket) -> str:
    """The text of ``sandcell approvals show`` for a tool ticket."""
    lines = [
        f"approval  {ticket.id}  {ticket.status}  (a tool call, not a run)",
        f"created   {ticket.created_at}",
        f"expires   {ticket.expires_at}",
        f"profile   {ticket.profile}",
        f"tool      {ticket.tool}",
        f"run       {ticket.run_id or 'not recorded'}",
        f"args      {ticket.args_bytes} bytes, sha256 {ticket.args_sha256}",
    ]
    if ticket.decided_by or ticket.decided_at:
        lines.append(
            f"decided   {ticket.status} by {ticket.decided_by or '-'} at {ticket.decided_at}"
        )
    if ticket.reason:
        lines.append(f"reason    {ticket.reason}")
    lines = [_visible(line) for line in lines]
    lines.append("arguments (secret-shaped values redacted)")
    lines.append("  " + _visible(ticket.args_preview))
    if ticket.status == "pending":
        lines.append(
            f"decide    sandcell approve {ticket.id}  |  sandcell deny {ticket.id} --reason ..."
        )
    return "\n".join(lines) + "\n"


def render_tool_list_lines(tickets: Sequence[ToolTicket]) -> list[str]:
    """One line per tool ticket, in the columns of ``sandcell approvals list``."""
    out = []
    for t in tickets:
        created = t.created_at[:19].replace("T", " ")
        args = t.args_preview if len(t.args_preview) <= 48 else t.args_preview[:45] + "..."
        what = _visible(f"{t.tool} {args} (profile {t.profile})")
        out.append(f"{t.id}  {created}  {'tool':<6}  {t.status:<8}  {what}")
    return out
