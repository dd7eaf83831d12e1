"""Pages of a tenant's runs waiting for approval (run tickets), at a bounded cost.

The service's table maps each approval id to its tenant; the tickets themselves are in the
executor's approval store. A page reads the tenant's approval ids newest first, from the cursor
on, and their tickets in batches (one statement per batch), looking at no more than
:data:`~sandcell.service.paging.MAX_SCAN` of them.
"""

from __future__ import annotations

from sandcell.policy.approvals import STATUSES, Ticket
from sandcell.service.core import Service
from sandcell.service.paging import MAX_SCAN, Page
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant

__all__ = ["owned_approvals_page"]

_BATCH = 200
"""Approval ids read (and tickets fetched) at a time while a page is built."""


def owned_approvals_page(
    service: Service, tenant: Tenant, status: str, *, limit: int, cursor: str | None
) -> Page[Ticket]:
    """A page of the tenant's run tickets in ``status`` (or ``all``), newest first, past
    ``cursor``. Blocking (reads the stores): call it in a worker thread."""
    if status != "all" and status not in STATUSES:
        raise ServiceProblem(400, f"status {status!r}: choose one of {', '.join(STATUSES)}, or all")
    table = service.tenants
    if cursor is not None and not table.owns(tenant.id, "approval", cursor):
        raise ServiceProblem(400, "cursor: not a cursor of this listing; list again without it")
    out: list[Ticket] = []
    scanned, after = 0, cursor
    while len(out) < limit and scanned < MAX_SCAN:
        ids = table.owned_after(
            tenant.id, "approval", after=after, limit=min(_BATCH, MAX_SCAN - scanned)
        )
        if not ids:
            return Page(out, None)
        tickets = service.executor.approvals.get_many(ids)
        for approval_id in ids:
            scanned += 1
            after = approval_id
            ticket = tickets.get(approval_id)
            if ticket is not None and status in ("all", ticket.status):
                out.append(ticket)
                if len(out) >= limit:
                    break
    return Page(out, after)
