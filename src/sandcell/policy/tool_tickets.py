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

The arguments are stored in full, as the exact canonical JSON the gateway hashed (``args_json``),
with their SHA-256 (``args_sha256``, the hash the call's record carries, so a ticket and the call
it let through can be matched in the audit) and the text a person reads (``args_preview``: the
same arguments, complete, indented one key per line, secret-shaped tokens redacted). Nothing is
cut: a preview cut at a length let padding push a ``DELETE`` out of sight. For an HTTP request
its request line (``METHOD /path?query``) is shown first and never redacted
(:func:`request_line`), so a redaction cannot hide what the call does. The gateway runs exactly
the bytes of ``args_json`` and checks their hash against the approved ticket's before it calls
the upstream (:mod:`sandcell.tools.gateway`).
"""

from __future__ import annotations

import json
import secrets
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sandcell.tools.records import canonical, text_digest
from sandcell.validation.redact import Redactor

__all__ = [
    "ARGS_JSON_COLUMN",
    "ID_PREFIX",
    "LIST_ARGS_CHARS",
    "TOOL_SCHEMA",
    "TOOL_STATUSES",
    "ToolTicket",
    "args_preview",
    "canonical_args",
    "is_tool_ticket_id",
    "new_tool_ticket_id",
    "render_tool_list_lines",
    "render_tool_ticket",
    "request_line",
]

TOOL_STATUSES = ("pending", "approved", "denied", "expired")
ID_PREFIX = "t"
"""First character of every tool ticket id; run ticket ids are hexadecimal and never start so."""
LIST_ARGS_CHARS = 48
"""How much of the arguments one line of ``approvals list`` shows (``show`` shows them all)."""

TOOL_SCHEMA = """CREATE TABLE IF NOT EXISTS tool_approvals (id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL, expires_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    profile TEXT NOT NULL, tool TEXT NOT NULL, run_id TEXT,
    args_preview TEXT NOT NULL, args_sha256 TEXT NOT NULL, args_bytes INTEGER NOT NULL,
    decided_by TEXT, decided_at TEXT, reason TEXT, args_json TEXT)"""
"""``IF NOT EXISTS``: also run on stores created before tool tickets existed."""
ARGS_JSON_COLUMN = "ALTER TABLE tool_approvals ADD COLUMN args_json TEXT"
"""For a store made before the full arguments were kept (its old rows have none: NULL)."""

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
    """The complete arguments as a person reads them: indented JSON, secret-shaped tokens
    redacted, nothing cut."""
    args_sha256: str
    """Of the arguments' canonical JSON: equal to the call record's ``args_sha256``."""
    args_bytes: int
    decided_by: str | None
    decided_at: str | None
    reason: str | None
    """The decider's reason, or why the ticket expired."""
    args_json: str | None = None
    """The exact canonical JSON of the arguments, as hashed and as the call runs; None only for
    a ticket filed before sandcell kept it (such a ticket cannot let a call through)."""
    request_line: str | None = None
    """``METHOD /path?query`` of an HTTP request (see :func:`request_line`); read from
    ``args_json`` by :meth:`from_row`."""
    intact: bool = False
    """Whether the stored arguments hash to ``args_sha256`` (the row was not edited); False
    when they were never kept."""

    @classmethod
    def from_row(cls, columns: Mapping[str, object]) -> ToolTicket:
        """The ticket of one row (:data:`COLUMNS`), with what is read from its arguments."""
        fields: dict[str, Any] = dict(columns)
        exact = fields.get("args_json")
        if isinstance(exact, str):
            fields["intact"] = text_digest(exact) == fields.get("args_sha256")
            try:
                fields["request_line"] = request_line(json.loads(exact))
            except ValueError:  # edited into something that is not JSON: not intact either
                fields["request_line"] = None
        return cls(**fields)

    def to_dict(self) -> dict[str, object]:
        """JSON form for ``--json`` output (``kind`` tells it from a run ticket); the arguments
        as shown (redacted), not their exact text."""
        shown = {k: v for k, v in asdict(self).items() if k != "args_json"}
        return {"kind": "tool_call", **shown}


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
    "args_json",
)


def new_tool_ticket_id() -> str:
    return ID_PREFIX + secrets.token_hex(6)


def is_tool_ticket_id(text: str) -> bool:
    """Whether ``text`` (an id or a prefix of one) names a tool ticket rather than a run."""
    return text.strip().lower().startswith(ID_PREFIX)


def canonical_args(args: Mapping[str, object]) -> str:
    """The canonical JSON of a call's arguments: what is stored, hashed and run (sorted keys,
    no spaces; :func:`sandcell.tools.records.digest` hashes exactly this text)."""
    return canonical(dict(args))


def args_preview(args: Mapping[str, object]) -> tuple[str, str, int]:
    """``(shown, sha256, size)`` of a call's arguments (see :class:`ToolTicket`): the complete
    arguments as a person reads them, and the hash and size of their canonical JSON."""
    text = canonical_args(args)
    pretty = json.dumps(dict(args), sort_keys=True, ensure_ascii=False, indent=2)
    shown, _ = _REDACTOR.scan_text(pretty)
    return shown, text_digest(text), len(text.encode("utf-8", "surrogatepass"))


def request_line(args: object) -> str | None:
    """``METHOD /path?query`` when the arguments are an HTTP request (string ``method`` and
    ``path``), else None. Never redacted: it is what the call does, and a person must see it
    whatever a secret-shaped token in it would otherwise hide. The query is shown sorted, as the
    HTTP tool sends it."""
    if not isinstance(args, Mapping):
        return None
    method, path = args.get("method"), args.get("path")
    if not isinstance(method, str) or not isinstance(path, str):
        return None
    query = args.get("query")
    if isinstance(query, Mapping) and query:
        path += "?" + urlencode(sorted((str(k), str(v)) for k, v in query.items()))
    return f"{method} {path}"


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
    line = ticket.request_line
    if line is not None:
        lines.append(f"request   {line}")
    if not ticket.intact:
        lines.append(
            "WARNING   the stored arguments do not match their sha256 (or were never kept): "
            "approving this ticket lets no call through"
        )
    if ticket.decided_by or ticket.decided_at:
        lines.append(
            f"decided   {ticket.status} by {ticket.decided_by or '-'} at {ticket.decided_at}"
        )
    if ticket.reason:
        lines.append(f"reason    {ticket.reason}")
    lines = [_visible(line) for line in lines]
    lines.append("arguments (complete; secret-shaped values redacted)")
    lines.extend("  " + _visible(part) for part in ticket.args_preview.split("\n"))
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
        # The request line leads, whole: a list line must not hide what an HTTP call does.
        args = t.request_line or " ".join(t.args_preview.split())
        if t.request_line is None and len(args) > LIST_ARGS_CHARS:
            args = args[: LIST_ARGS_CHARS - 3] + "..."
        what = _visible(f"{t.tool} {args} (profile {t.profile})")
        out.append(f"{t.id}  {created}  {'tool':<6}  {t.status:<8}  {what}")
    return out
