"""The approval flow: what becomes of a run whose code the profile sends to a person.

:func:`run_with_approval` stores the run as a ticket (in the
:class:`~sandcell.policy.approvals.ApprovalStore`) and either leaves it waiting (an
``awaiting_approval`` result) or lets the caller's callback decide at once. Later,
:func:`run_approved` runs exactly the stored request once a person approves it (the same
profile, by content hash, and the checks admitting it again), and :func:`deny_approval` records
the refusal as a run that did not happen. A ticket keeps the rung the run was submitted for, its
declared result in JSON form, and the fields its record gets (a replay's link to its original).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from sandcell.backends.base import Backend
from sandcell.errors import ConfigError, SandcellError
from sandcell.pipeline.execute import Host, PostCollect, execute
from sandcell.pipeline.finish import not_run
from sandcell.pipeline.prepare import Prepared, prepare
from sandcell.policy.approvals import ApprovalStore, Ticket, approval_record, default_approver
from sandcell.policy.profiles import Profile
from sandcell.spec import Outcome, RunRequest, RunResult
from sandcell.validation import InvariantLike

if TYPE_CHECKING:
    import pydantic

    from sandcell.live_output import OutputListener

ApprovalCallback = Callable[[Ticket], bool]
"""Called with the stored ticket of a run that needs approval; True approves and runs it."""


class ApprovalHost(Host, Protocol):
    """What the flow needs of the executor: a run's host, and the store of tickets."""

    @property
    def approvals(self) -> ApprovalStore: ...


def run_with_approval(
    host: ApprovalHost,
    prepared: Prepared,
    *,
    approve: ApprovalCallback | None,
    schema: Mapping[str, object] | None,
    model: type[pydantic.BaseModel] | None,
    invariants: Sequence[InvariantLike],
    result_file: str | None,
    record_extra: Mapping[str, object] | None,
    ran_extra: Mapping[str, object] | None,
    wrap: Callable[[RunRequest], RunRequest] | None = None,
    run_id: str | None = None,
    on_output: OutputListener | None = None,
    post_collect: PostCollect | None = None,
) -> RunResult:
    """A prepared run whose verdict is ``approve``: stored as a ticket; without ``approve`` it
    waits (and a pydantic ``model`` or a callable invariant, which cannot be stored, is a
    ConfigError), else ``approve(ticket)`` decides now and the approved run runs. The caller's
    declared result is stored with the ticket, with ``record_extra`` (the record's fields of a
    run that does not run; ``ran_extra`` those of the run when it runs)."""
    admission, policy = prepared.admission, prepared.policy
    ticket = host.approvals.submit(
        admission.request,
        # The rung is part of what is approved: the run happens on it, or not at all.
        profile={**admission.profile.to_record(), "backend": prepared.backend.name},
        findings=policy["findings"],  # type: ignore[arg-type]
        why=admission.decision.reason,
        declared=_with_record_extra(
            _declared_for_storage(
                schema=schema,
                model=model,
                invariants=invariants,
                result_file=result_file,
                waiting=approve is None,
            ),
            record_extra,
        ),
    )
    if approve is None:
        return not_run(
            host,
            admission.request,
            Outcome.AWAITING_APPROVAL,
            f"waiting for approval {ticket.id} ({admission.decision.reason}); "
            f"approve it with: sandcell approve {ticket.id}",
            policy={**policy, "approval": {"id": ticket.id, "status": "pending"}},
            backend=prepared.backend,
            record_extra=record_extra,
        )
    who = f"callback:{getattr(approve, '__qualname__', 'approve')}"
    if not approve(ticket):
        denied = host.approvals.deny(ticket.id, by=who, reason="the approval callback refused")
        return not_run(
            host,
            admission.request,
            Outcome.DENIED,
            f"approval {ticket.id} was denied by {who}",
            policy={**policy, "approval": _denial(denied)},
            backend=prepared.backend,
            record_extra=record_extra,
        )
    approved = host.approvals.approve(ticket.id, by=who)
    result = execute(
        host,
        wrap(approved.request) if wrap is not None else approved.request,
        backend=prepared.backend,
        profile=admission.profile,
        validators=prepared.validators,
        policy={**policy, "approval": approval_record(approved.ticket)},
        run_id=run_id,
        on_output=on_output,
        record_extra=ran_extra,
        post_collect=post_collect,
    )
    host.approvals.mark_ran(ticket.id, result.run_id)
    return result


def run_approved(
    host: ApprovalHost,
    approval_id: str,
    *,
    load: Callable[[str], Profile],
    backend: Callable[[Profile, Ticket], Backend],
    by: str | None = None,
    reason: str = "",
    run_id: str | None = None,
    on_output: OutputListener | None = None,
) -> RunResult:
    """Approve the waiting run ``approval_id`` and run exactly its stored request.

    ``load`` loads a profile by name or path; ``backend(profile, ticket)`` is the backend of the
    ticket's run (on the rung it was submitted for, which a ticket keeps since rungs are stored).
    Raises ConfigError when the profile changed since, or its checks now deny the code; a run
    that cannot start leaves the ticket waiting again."""
    ticket = host.approvals.get(approval_id)
    source = str(ticket.profile.get("source") or "")
    # A built-in is loaded by name; a user profile from the file it was loaded from.
    profile = load(
        str(ticket.profile.get("name")) if source.startswith("builtin:") or not source else source
    )
    chosen = backend(profile, ticket)
    if profile.sha256 != ticket.profile.get("sha256"):
        raise ConfigError(
            f"profile {profile.name!r} changed since approval {ticket.id} was submitted; deny "
            "it and submit the run again under the current profile"
        )
    declared = ticket.declared or {}
    stored_file = declared.get("result_file")
    stored_schema = declared.get("schema")
    stored_invariants = declared.get("invariants")
    prepared = prepare(
        ticket.request,
        profile,
        wheels=host.wheels,
        backend=lambda _: chosen,
        result_file=stored_file if isinstance(stored_file, str) else None,
        schema=stored_schema if isinstance(stored_schema, dict) else None,
        invariants=[str(i) for i in stored_invariants]
        if isinstance(stored_invariants, list)
        else (),
    )
    if prepared.verdict == "deny":
        # Same code, same profile: only the checks themselves changed since submission.
        raise ConfigError(
            f"the checks now deny the code of approval {ticket.id} "
            f"({prepared.admission.decision.reason}); deny it"
        )
    approved = host.approvals.approve(ticket.id, by=by or default_approver(), reason=reason)
    policy = {**prepared.policy, "approval": approval_record(approved.ticket)}
    try:
        result = execute(
            host,
            approved.request,
            backend=chosen,
            profile=profile,
            validators=prepared.validators,
            policy=policy,
            run_id=run_id,
            on_output=on_output,
            record_extra=_stored_record_extra(declared),
        )
    except SandcellError:
        # Nothing ran: the ticket waits again rather than stay approved and unrunnable.
        host.approvals.reopen(ticket.id)
        raise
    host.approvals.mark_ran(ticket.id, result.run_id)
    return result


def deny_approval(
    host: ApprovalHost, approval_id: str, backend: Backend, *, reason: str, by: str | None = None
) -> RunResult:
    """Deny the waiting run ``approval_id``; recorded as a run on ``backend`` that did not
    happen."""
    ticket = host.approvals.deny(approval_id, by=by or default_approver(), reason=reason)
    record = {
        "profile": ticket.profile,
        "verdict": "approve",
        "reason": ticket.reason_for_approval,
        "findings": list(ticket.findings),
        "approval": _denial(ticket),
    }
    return not_run(
        host,
        ticket.request,
        Outcome.DENIED,
        f"approval {ticket.id} was denied by {ticket.decided_by}: {ticket.decision_reason}",
        policy=record,
        backend=backend,
        record_extra=_stored_record_extra(ticket.declared or {}),
    )


def _declared_for_storage(
    *,
    schema: Mapping[str, object] | None,
    model: type[pydantic.BaseModel] | None,
    invariants: Sequence[InvariantLike],
    result_file: str | None,
    waiting: bool,
) -> dict[str, object] | None:
    """The caller's declared result in a form the approval store keeps (JSON), so that the
    approved run, later, is validated as the caller asked. A pydantic model or a callable cannot
    be stored: a run that must wait for a person cannot use them."""
    if waiting and (model is not None or any(callable(i) for i in invariants)):
        raise ConfigError(
            "this run needs approval and will wait for it, but a pydantic model or a callable "
            "invariant cannot be stored with it; pass approve=... to decide now, or declare the "
            "result with a JSON Schema and textual invariants"
        )
    texts = [i if isinstance(i, str) else getattr(i, "source", None) for i in invariants]
    if not (schema or texts or result_file):
        return None
    return {
        "schema": dict(schema) if schema else None,
        "invariants": [t for t in texts if isinstance(t, str)],
        "result_file": result_file,
    }


def _with_record_extra(
    declared: dict[str, object] | None, record_extra: Mapping[str, object] | None
) -> dict[str, object] | None:
    """The declared result stored with an approval ticket, plus the fields the approved run's
    record gets (so a replay that waited for approval stays linked to its original)."""
    if not record_extra:
        return declared
    base = declared or {"schema": None, "invariants": [], "result_file": None}
    return {**base, "record_extra": dict(record_extra)}


def _stored_record_extra(declared: Mapping[str, object]) -> Mapping[str, object] | None:
    extra = declared.get("record_extra")
    return extra if isinstance(extra, Mapping) else None


def _denial(ticket: Ticket) -> dict[str, object]:
    return {
        "approval_id": ticket.id,
        "denied_by": ticket.decided_by,
        "denied_at": ticket.decided_at,
        "decision_reason": ticket.decision_reason,
        "requested_because": ticket.reason_for_approval,
    }
