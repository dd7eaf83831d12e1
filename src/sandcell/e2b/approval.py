"""A cell or command that needs approval: a ticket in the approval queue, named in the error.

A session cannot wait for a person, so the cell is not run; its code goes to the approval queue
like a run's, owned by the tenant, and the E2B error names the ticket. Approved (``sandcell
approve ID`` or the service's approval endpoints), it runs once as a run of its own, in a fresh
sandbox under the same profile, not in the E2B sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sandcell.e2b.registry import E2BSandbox
from sandcell.service.core import Service
from sandcell.service.kept_bytes import held_bytes
from sandcell.spec import Language, RunResult

__all__ = [
    "approval_message",
    "approval_sentence",
    "needs_approval",
    "ticket_for",
    "ticket_for_policy",
]


def needs_approval(result: RunResult) -> bool:
    return result.outcome.value == "denied" and (result.policy or {}).get("verdict") == "approve"


def ticket_for(
    service: Service, box: E2BSandbox, result: RunResult, code: str, language: Language
) -> str:
    """Queue ``code`` for approval for the sandbox's tenant; the ticket's id."""
    return ticket_for_policy(service, box, result.policy or {}, code, language)


def ticket_for_policy(
    service: Service, box: E2BSandbox, policy: Mapping[str, object], code: str, language: Language
) -> str:
    """:func:`ticket_for` from the verdict alone (a background command refused before it
    started has no result)."""
    findings = policy.get("findings")
    # A Python cell runs with the display module, as in the session: its outputs, display()
    # and the shell escapes of its translation (sandcell.e2b.ipython) work when approved.
    request = replace(
        box.session.request,
        code=code,
        language=language,
        exports=(),
        display=language == "python",
    )
    backend = service.executor.backend_for(box.session.profile).name
    ticket = service.executor.approvals.submit(
        request,
        profile={**box.session.profile.to_record(), "backend": backend},
        findings=[f for f in findings if isinstance(f, Mapping)]
        if isinstance(findings, Sequence)
        else [],
        why=str(policy.get("reason") or "the profile asks for a person's approval"),
    )
    # Counted against the tenant's stored bytes until decided (sandcell.service.quotas).
    service.tenants.own(box.tenant, "approval", [ticket.id], size=held_bytes(ticket))
    return ticket.id


def approval_message(ticket: str, result: RunResult) -> str:
    return approval_sentence(ticket, (result.policy or {}).get("reason") or result.reason)


def approval_sentence(ticket: str, reason: object) -> str:
    return (
        f"needs approval {ticket} ({reason}); a person approves it with `sandcell approve "
        f"{ticket}`, and it then runs once as a run of its own, outside this sandbox"
    )
