"""Asking the MCP client's user to approve a run that waits for approval.

On the handshake-era protocol the question is an ``elicitation/create`` request sent while the
tool call is open; on the 2026-era protocol, where a server may not send requests, the tool call
returns an ``InputRequiredResult`` carrying the same question, and the client calls the tool
again with the answer and the sealed ``request_state`` naming the approval. Either way the answer
approves the stored request (run exactly as stored, ``Executor.run_approved``) or denies it with
the person's reason (``Executor.deny_approval``). A client that cannot ask gets the approval id
and the command that decides it; so does one whose user dismisses the question or does not
answer in time.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from mcp.server.elicitation import render_elicitation_schema
from mcp.types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from pydantic import BaseModel, Field

from sandcell.policy.approvals import Ticket

STATE_KEY = "sandcell_approval"
"""The key of the approval id in a 2026-era ``request_state`` (sealed by the SDK)."""
INPUT_KEY = "approval"
"""The key of the question in ``InputRequiredResult.input_requests``."""

_MAX_CODE_SHOWN = 4000
_CLIENT_NAME = re.compile(r"[^A-Za-z0-9._-]")


class ApprovalAnswer(BaseModel):
    """What the person answers."""

    decision: Literal["approve", "deny"] = Field(
        description="approve: the stored program runs exactly as shown; deny: it never runs"
    )
    reason: str = Field(default="", description="why (recorded with the decision)")


def question(ticket: Ticket) -> str:
    """The text the client shows its user: what would run, under which profile, and why it
    waits. The code is the model's; it is shown, never interpreted."""
    code = ticket.request.code
    shown = code if len(code) <= _MAX_CODE_SHOWN else code[:_MAX_CODE_SHOWN] + "\n[... cut]"
    lines = [
        f"sandcell: a {ticket.request.language} run needs your approval "
        f"(approval {ticket.id}, profile {ticket.profile.get('name')!s}).",
        f"Why it waits: {ticket.reason_for_approval}",
    ]
    for f in ticket.findings:
        lines.append(
            f"- {f.get('rule_id')} ({f.get('severity')}) line {f.get('line')}: {f.get('message')}"
        )
    if ticket.request.inputs:
        lines.append("Inputs: " + ", ".join(i.name for i in ticket.request.inputs))
    lines.append(f"Code ({len(code)} characters):\n{shown}")
    return "\n".join(lines)


def input_required(ticket: Ticket) -> InputRequiredResult:
    """The 2026-era form of the question; the retry carries the answer and the approval id."""
    request = ElicitRequest(
        params=ElicitRequestFormParams(
            message=question(ticket),
            requested_schema=render_elicitation_schema(ApprovalAnswer),
        )
    )
    return InputRequiredResult(
        input_requests={INPUT_KEY: request},
        request_state=json.dumps({STATE_KEY: ticket.id}),
    )


def approval_from_state(state: str | None) -> str | None:
    """The approval id a 2026-era retry carries back, or None on a first call."""
    if not state:
        return None
    try:
        decoded = json.loads(state)
    except ValueError:
        return None
    value = decoded.get(STATE_KEY) if isinstance(decoded, dict) else None
    return value if isinstance(value, str) else None


def approver_name(client_name: str | None) -> str:
    """Who is recorded as deciding: the client's self-declared name, reduced to a safe token
    (it is the peer's text, not an identity)."""
    name = _CLIENT_NAME.sub("_", client_name or "client")[:64] or "client"
    return f"mcp-elicitation:{name}"


def pending_note(approval_id: str) -> str:
    return (
        f"approval {approval_id} is pending: a person approves it with `sandcell approve "
        f"{approval_id}` or denies it with `sandcell deny {approval_id} --reason '...'` on the "
        "host running this server (same data directory)"
    )
