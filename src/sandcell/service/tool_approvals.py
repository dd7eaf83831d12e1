"""Which governed tool calls waiting for a person (tool tickets, ids ``t...``) are a tenant's.

A tool ticket names the run that asked (``run_id``: a run's id, or a session's for its cells,
which share the session's gateway). It is the tenant's when that run or session is: in memory
while the run is in flight, in the service's table once it has ended. Both ``/v1/tool-approvals``
and the ``/ui`` pages decide with these, so a tenant reaches exactly the same tickets either way.
"""

from __future__ import annotations

from sandcell.policy.approvals import ApprovalError
from sandcell.policy.tool_tickets import TOOL_STATUSES, ToolTicket, is_tool_ticket_id
from sandcell.service.approving import check_may_approve_tool
from sandcell.service.core import Service
from sandcell.service.paging import MAX_SCAN, Page
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Principal, Tenant

__all__ = ["decide", "owned_ticket", "owned_tickets_page", "owns"]

_BATCH = 200
"""Tool tickets read from the store at a time while a page is built."""
_CURSOR_PREFIX = "p"


def owns(service: Service, tenant: Tenant, ticket: ToolTicket) -> bool:
    asker = ticket.run_id
    if not asker:
        return False  # a call nobody can be tied to is no tenant's: decided on the host
    state = service.runs.get(asker)
    if state is not None:
        return state.tenant == tenant.id
    table = service.tenants
    return table.owns(tenant.id, "run", asker) or table.owns(tenant.id, "session", asker)


def owned_ticket(service: Service, tenant: Tenant, ticket_id: str) -> ToolTicket:
    """The tenant's tool ticket with exactly this id; 404 for any other (another tenant's, a
    prefix, a run's approval id), as if it did not exist."""
    missing = ServiceProblem(404, f"no tool call {ticket_id!r}")
    if not is_tool_ticket_id(ticket_id):
        raise missing
    try:
        ticket = service.executor.approvals.get_tool(ticket_id)
    except ApprovalError:
        raise missing from None
    # The store also finds a unique prefix, which must not let a tenant probe for others'.
    if ticket.id != ticket_id or not owns(service, tenant, ticket):
        raise missing
    return ticket


def owned_tickets_page(
    service: Service, tenant: Tenant, status: str, *, limit: int, cursor: str | None
) -> Page[ToolTicket]:
    """A page of the tenant's tool tickets in ``status`` (or ``all``), newest first, past
    ``cursor``; it looks at no more than :data:`~sandcell.service.paging.MAX_SCAN` tickets
    of the store (every tenant's), so it may be short and still have a next cursor. The
    cursor is a position in the store, never another tenant's ticket id. Blocking (reads the
    stores): call it in a worker thread."""
    if status != "all" and status not in TOOL_STATUSES:
        raise ServiceProblem(
            400, f"status {status!r}: choose one of {', '.join(TOOL_STATUSES)}, or all"
        )
    before = _position(cursor)
    store = service.executor.approvals
    wanted = None if status == "all" else status
    mine: dict[str, bool] = {}  # by run id: the tickets of one run come together
    out: list[ToolTicket] = []
    scanned = 0
    while len(out) < limit and scanned < MAX_SCAN:
        batch = store.tools_before(wanted, min(_BATCH, MAX_SCAN - scanned), before=before)
        if not batch:
            return Page(out, None)
        for position, ticket in batch:
            scanned += 1
            before = position
            key = ticket.run_id or ""
            if key not in mine:
                mine[key] = owns(service, tenant, ticket)
            if mine[key]:
                out.append(ticket)
                if len(out) >= limit:
                    break
    return Page(out, f"{_CURSOR_PREFIX}{before}")


def _position(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    digits = cursor.removeprefix(_CURSOR_PREFIX)
    if not cursor.startswith(_CURSOR_PREFIX) or not digits.isdecimal() or len(digits) > 18:
        raise ServiceProblem(400, "cursor: not a cursor of this listing; list again without it")
    return int(digits)


async def decide(
    service: Service,
    principal: Principal,
    ticket_id: str,
    *,
    approve: bool,
    reason: str,
    surface: str = "",
) -> ToolTicket:
    """Approve (the waiting call goes ahead) or deny (it is refused, ``reason`` required) the
    tenant's tool ticket; 409 when it is no longer pending, 403 when ``principal`` may not
    approve it (:mod:`sandcell.service.approving`). ``surface`` is added to the decider's
    name in the record (`` (browser)``)."""
    ticket = owned_ticket(service, principal.tenant, ticket_id)
    by = principal.who + surface
    reason = reason.strip()
    if not approve and not reason:
        raise ServiceProblem(400, "reason: say why the call is denied")
    if ticket.status != "pending":
        raise ServiceProblem(409, f"tool call {ticket.id!r} is {ticket.status}, not pending")
    if approve:
        check_may_approve_tool(principal, ticket)
    store = service.executor.approvals

    def act() -> ToolTicket:
        if approve:
            return store.approve_tool(ticket.id, by=by, reason=reason)
        return store.deny_tool(ticket.id, by=by, reason=reason)

    try:
        decided: ToolTicket = await service.in_thread(act)
    except ApprovalError as exc:  # decided (or expired) by someone else meanwhile
        raise ServiceProblem(409, str(exc)) from None
    return decided
