"""Approvals, run records, artifacts and profiles, each limited to what the caller's tenant
owns: anything else is answered 404, exactly as if it did not exist."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse

from sandcell.policy.approvals import STATUSES, Ticket
from sandcell.policy.profiles import list_profiles
from sandcell.service.api_runs import _PROBLEMS, status_body, wait_for
from sandcell.service.approving import check_may_approve_run
from sandcell.service.deps import CurrentPrincipal, CurrentTenant, ServiceDep
from sandcell.service.kept_bytes import kept_stdin
from sandcell.service.models import (
    ApprovalBody,
    AuditEntryBody,
    AuditSummaryBody,
    DecisionBody,
    ProfileBody,
    ResultBody,
    RunStatusBody,
    VerifyBody,
)
from sandcell.service.paging import MAX_LIMIT, NEXT_CURSOR, send_cursor
from sandcell.service.problems import ServiceProblem
from sandcell.service.run_approvals import owned_approvals_page
from sandcell.service.tenants import Tenant
from sandcell.spec import RunResult, result_to_dict

__all__ = ["router"]

router = APIRouter(prefix="/v1")


def _approval(ticket: Ticket) -> ApprovalBody:
    return ApprovalBody(
        id=ticket.id,
        created_at=ticket.created_at,
        status=ticket.status,
        code=ticket.request.code,
        language=ticket.request.language,
        profile=dict(ticket.profile),
        findings=[dict(f) for f in ticket.findings],
        reason_for_approval=ticket.reason_for_approval,
        decided_by=ticket.decided_by,
        decided_at=ticket.decided_at,
        decision_reason=ticket.decision_reason,
        run_id=ticket.run_id,
        intact=ticket.intact,
    )


def _owned_ticket(service: ServiceDep, tenant: Tenant, approval_id: str) -> Ticket:
    # The exact id only: the store also takes a prefix, which must not let a tenant probe
    # for another's tickets.
    if not service.tenants.owns(tenant.id, "approval", approval_id):
        raise ServiceProblem(404, f"no approval {approval_id!r}")
    return service.executor.approvals.get(approval_id)


@router.get(
    "/approvals", response_model=list[ApprovalBody], tags=["approvals"], responses=_PROBLEMS
)
async def list_approvals(
    *,
    service: ServiceDep,
    principal: CurrentPrincipal,
    response: Response,
    status: Annotated[
        str, Query(description=f"one of {', '.join(STATUSES)}, or 'all'")
    ] = "pending",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Annotated[
        str | None, Query(description=f"where to go on: the {NEXT_CURSOR} of the page before")
    ] = None,
) -> list[ApprovalBody]:
    """The tenant's runs waiting for approval (or decided: ``status``), newest first (the
    tenant's key or one of its approver keys). One page: a header ``X-Next-Cursor`` (and
    ``Link``) says where the next one starts; a page may be short and still have one."""
    tenant = principal.tenant
    found = await service.in_thread(
        lambda: owned_approvals_page(service, tenant, status, limit=limit, cursor=cursor)
    )
    send_cursor(response, found, f"/v1/approvals?status={status}&limit={limit}&")
    return [_approval(t) for t in found.items]


@router.get(
    "/approvals/{approval_id}", response_model=ApprovalBody, tags=["approvals"], responses=_PROBLEMS
)
async def get_approval(
    approval_id: str, service: ServiceDep, principal: CurrentPrincipal
) -> ApprovalBody:
    return _approval(_owned_ticket(service, principal.tenant, approval_id))


@router.post(
    "/approvals/{approval_id}/approve",
    response_model=RunStatusBody,
    tags=["approvals"],
    responses=_PROBLEMS,
)
async def approve(
    approval_id: str,
    body: DecisionBody,
    request: Request,
    service: ServiceDep,
    principal: CurrentPrincipal,
) -> RunStatusBody:
    """Approve a waiting run and run exactly the stored request; answers with its result.
    Takes one of the tenant's approver keys (the tenant's own key only where the run's
    profile says ``submitter_may_approve``)."""
    tenant = principal.tenant
    ticket = _owned_ticket(service, tenant, approval_id)
    if ticket.status != "pending":
        raise ServiceProblem(409, f"approval {approval_id!r} is {ticket.status}, not pending")
    check_may_approve_run(principal, ticket)
    service.admit(tenant, sandbox=True)
    state = service.new_run(tenant)
    state.stdin = kept_stdin(ticket.request)
    who = principal.who

    def call(run_id: str) -> RunResult:
        return service.executor.run_approved(ticket.id, by=who, reason=body.reason, run_id=run_id)

    def cleanup(result: RunResult | None) -> None:
        if result is not None:  # it ran (or was refused for good): the inputs are done with
            service.settle_approval(tenant.id, ticket)

    service.start(state, call, cleanup=cleanup)
    await wait_for(request, service, state)
    return status_body(state)


@router.post(
    "/approvals/{approval_id}/deny",
    response_model=ResultBody,
    tags=["approvals"],
    responses=_PROBLEMS,
)
async def deny(
    approval_id: str, body: DecisionBody, service: ServiceDep, principal: CurrentPrincipal
) -> ResultBody:
    """Deny a waiting run; the denial is recorded as a run that did not happen (the tenant's
    key, withdrawing its own run, or one of its approver keys)."""
    tenant = principal.tenant
    ticket = _owned_ticket(service, tenant, approval_id)
    if not body.reason.strip():
        raise ServiceProblem(400, "reason: say why the run is denied")
    result: RunResult = await service.in_thread(
        lambda: service.executor.deny_approval(ticket.id, reason=body.reason, by=principal.who)
    )
    service.own_result(tenant.id, result)
    service.settle_approval(tenant.id, ticket)
    return ResultBody.model_validate(result_to_dict(result))


def _summary(record: dict[str, object]) -> AuditSummaryBody:
    usage = record.get("usage")
    wall = usage.get("wall_ms") if isinstance(usage, dict) else None
    return AuditSummaryBody(
        run_id=str(record.get("run_id")),
        started_at=_text(record.get("started_at")),
        language=_text(record.get("language")),
        outcome=_text(record.get("outcome")),
        wall_ms=float(wall) if isinstance(wall, int | float) else None,
        session_id=_text(record.get("session_id")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@router.get("/audit", response_model=list[AuditSummaryBody], tags=["audit"], responses=_PROBLEMS)
async def list_records(
    service: ServiceDep,
    tenant: CurrentTenant,
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[AuditSummaryBody]:
    """The tenant's run records, newest first (runs still in flight have none yet)."""

    def read() -> list[AuditSummaryBody]:
        out = []
        for run_id in service.tenants.owned(tenant.id, "run", limit=limit, offset=offset):
            entry = service.executor.audit.get(run_id)
            if entry is not None:
                out.append(_summary(dict(entry.record)))
        return out

    # Up to `limit` reads of the log: in a worker thread, not on the event loop.
    found: list[AuditSummaryBody] = await service.in_thread(read)
    return found


@router.get("/audit/verify", response_model=VerifyBody, tags=["audit"], responses=_PROBLEMS)
async def verify(service: ServiceDep, tenant: CurrentTenant) -> VerifyBody:
    """Check the hash chain; problems are shown for the tenant's own records only. It runs in
    a process of its own, one at a time per tenant (429 while the tenant's previous one runs)."""
    found = await service.audit_verifications.verify(tenant.id)
    return VerifyBody(
        ok=found.ok,
        records=found.records,
        problems=list(found.problems),
        other_problems=found.other_problems,
    )


@router.get("/audit/{run_id}", response_model=AuditEntryBody, tags=["audit"], responses=_PROBLEMS)
async def show_record(run_id: str, service: ServiceDep, tenant: CurrentTenant) -> AuditEntryBody:
    if not service.tenants.owns(tenant.id, "run", run_id):
        raise ServiceProblem(404, f"no record of run {run_id!r}")
    entry = service.executor.audit.get(run_id)
    if entry is None:
        raise ServiceProblem(404, f"no record of run {run_id!r} yet: it has not finished")
    return AuditEntryBody(
        seq=entry.seq, hash=entry.hash, prev_hash=entry.prev_hash, record=dict(entry.record)
    )


@router.get(
    "/artifacts/{sha256}",
    tags=["artifacts"],
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **_PROBLEMS},
)
async def get_artifact(sha256: str, service: ServiceDep, tenant: CurrentTenant) -> FileResponse:
    """An artifact's bytes, by the SHA-256 in a result."""
    if not service.tenants.owns(tenant.id, "artifact", sha256):
        raise ServiceProblem(404, f"no artifact {sha256!r}")
    path = service.executor.store.path_for(sha256)
    if not path.is_file():
        raise ServiceProblem(404, f"no artifact {sha256!r}")
    return FileResponse(
        path, media_type="application/octet-stream", headers={"X-Sandcell-Sha256": sha256}
    )


@router.delete("/artifacts/{sha256}", status_code=204, tags=["artifacts"], responses=_PROBLEMS)
async def forget_artifact(sha256: str, service: ServiceDep, tenant: CurrentTenant) -> None:
    """Stop keeping an artifact for the tenant (its bytes no longer count against its quota;
    the records that name it are unchanged)."""
    if not service.tenants.disown(tenant.id, "artifact", sha256):
        raise ServiceProblem(404, f"no artifact {sha256!r}")


@router.get("/profiles", response_model=list[ProfileBody], tags=["profiles"], responses=_PROBLEMS)
async def profiles(tenant: CurrentTenant) -> list[ProfileBody]:
    """The profiles the tenant may use, in its order (the first is its default)."""
    found = {s.name: s for s in list_profiles()}
    out = []
    for name in tenant.profiles:
        s = found.get(name)
        out.append(
            ProfileBody(
                name=name,
                source=s.source if s else "",
                description=s.description if s else "",
                approval=None if s is None or s.approval is None else str(s.approval),
                problem=None
                if s is not None
                else f"profile {name!r} is not installed on this host",
            )
        )
    return out
