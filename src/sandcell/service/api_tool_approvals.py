"""``/v1/tool-approvals``: governed tool calls a tenant's runs and sessions wait on (tool
tickets, ids ``t...``): list, show, approve (the call goes ahead), deny (it is refused).

The same scoping and the same store as the ``/ui`` pages (:mod:`sandcell.service.tool_approvals`);
a tool ticket that is not the caller's is 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from sandcell.policy.tool_tickets import TOOL_STATUSES, ToolTicket
from sandcell.service import tool_approvals
from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.deps import CurrentPrincipal, ServiceDep
from sandcell.service.models import DecisionBody, ToolApprovalBody
from sandcell.service.paging import MAX_LIMIT, NEXT_CURSOR, send_cursor

__all__ = ["router"]

router = APIRouter(prefix="/v1/tool-approvals", tags=["approvals"])


def _body(ticket: ToolTicket) -> ToolApprovalBody:
    # The body names a subset of the ticket's fields, under the same names.
    return ToolApprovalBody.model_validate(ticket, from_attributes=True)


@router.get("", response_model=list[ToolApprovalBody], responses=_PROBLEMS)
async def list_tool_approvals(
    *,
    service: ServiceDep,
    principal: CurrentPrincipal,
    response: Response,
    status: Annotated[
        str, Query(description=f"one of {', '.join(TOOL_STATUSES)}, or 'all'")
    ] = "pending",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Annotated[
        str | None, Query(description=f"where to go on: the {NEXT_CURSOR} of the page before")
    ] = None,
) -> list[ToolApprovalBody]:
    """The tool calls the tenant's runs and sessions wait on (or decided: ``status``), newest
    first. One page: a header ``X-Next-Cursor`` (and ``Link``) says where the next one starts;
    a page may be short and still have one."""
    found = await service.in_thread(
        lambda: tool_approvals.owned_tickets_page(
            service, principal.tenant, status, limit=limit, cursor=cursor
        )
    )
    send_cursor(response, found, f"/v1/tool-approvals?status={status}&limit={limit}&")
    return [_body(t) for t in found.items]


@router.get("/{ticket_id}", response_model=ToolApprovalBody, responses=_PROBLEMS)
async def get_tool_approval(
    ticket_id: str, service: ServiceDep, principal: CurrentPrincipal
) -> ToolApprovalBody:
    """One tool call: the tool, its arguments (secret-shaped values redacted), its deadline."""
    return _body(tool_approvals.owned_ticket(service, principal.tenant, ticket_id))


@router.post("/{ticket_id}/approve", response_model=ToolApprovalBody, responses=_PROBLEMS)
async def approve_tool_call(
    ticket_id: str, body: DecisionBody, service: ServiceDep, principal: CurrentPrincipal
) -> ToolApprovalBody:
    """Let the waiting call go ahead (``reason`` optional, recorded). Takes one of the tenant's
    approver keys (its own key only where the profile says ``submitter_may_approve``)."""
    decided = await tool_approvals.decide(
        service, principal, ticket_id, approve=True, reason=body.reason
    )
    return _body(decided)


@router.post("/{ticket_id}/deny", response_model=ToolApprovalBody, responses=_PROBLEMS)
async def deny_tool_call(
    ticket_id: str, body: DecisionBody, service: ServiceDep, principal: CurrentPrincipal
) -> ToolApprovalBody:
    """Refuse the waiting call (``reason`` required, recorded); the program gets the refusal."""
    decided = await tool_approvals.decide(
        service, principal, ticket_id, approve=False, reason=body.reason
    )
    return _body(decided)
