"""Who may decide a tenant's held run or tool call, checked in one place for ``/v1`` and ``/ui``.

Submitting and approving are separate credentials: the tenant's API key submits; its approver
keys (``sandcell tenants add-approver``) approve. An agent holding the tenant's key therefore
cannot approve its own run, unless the run's profile says ``submitter_may_approve = true``. A
submitter may still deny (withdraw) its own held run or tool call: that runs nothing.

Approving also re-checks the profile: a run held under a profile the tenant has since lost
(``sandcell tenants`` changed it) is refused, as a new run under it would be.
"""

from __future__ import annotations

from sandcell.errors import ConfigError
from sandcell.policy.approvals import Ticket
from sandcell.policy.profiles import Profile, load_profile
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Principal

__all__ = ["check_may_approve_run", "check_may_approve_tool"]


def _profile_name(ticket: Ticket) -> str:
    name = ticket.profile.get("name")
    if not isinstance(name, str) or not name:
        raise ServiceProblem(
            409, f"approval {ticket.id!r} names no profile; it cannot be approved here"
        )
    return name


def _check_submitter(principal: Principal, profile: Profile, what: str) -> None:
    if principal.role in ("approver", "owner") or profile.submitter_may_approve:
        return
    raise ServiceProblem(
        403,
        f"{what} may not be approved with tenant {principal.tenant.name!r}'s own API key, the "
        "key that submits its runs: use one of its approver keys (`sandcell tenants "
        f"add-approver {principal.tenant.name} NAME`), or set submitter_may_approve = true in "
        f"profile {profile.name!r}",
    )


def _load(name: str, what: str) -> Profile:
    try:
        return load_profile(name)
    except ConfigError as exc:
        raise ServiceProblem(409, f"{what}: its profile {name!r} cannot be loaded: {exc}") from None


def check_may_approve_run(principal: Principal, ticket: Ticket) -> None:
    """Refuse (403) approving ``ticket`` as ``principal``: its profile is no longer one of the
    tenant's, or the principal is the submitter and the profile does not let it approve."""
    name = _profile_name(ticket)
    what = f"approval {ticket.id!r}"
    if name not in principal.tenant.profiles:
        raise ServiceProblem(
            403,
            f"{what} was held under profile {name!r}, which is no longer one of tenant "
            f"{principal.tenant.name!r}'s profiles ({', '.join(principal.tenant.profiles)}); "
            "deny it, or give the tenant the profile again and then approve it",
        )
    _check_submitter(principal, _load(name, what), what)


def check_may_approve_tool(principal: Principal, ticket: ToolTicket) -> None:
    """As :func:`check_may_approve_run`, for a tool call a run or session waits on (the profile
    is the asking run's)."""
    what = f"tool call {ticket.id!r}"
    if ticket.profile not in principal.tenant.profiles:
        raise ServiceProblem(
            403,
            f"{what} was asked under profile {ticket.profile!r}, which is no longer one of "
            f"tenant {principal.tenant.name!r}'s profiles; deny it",
        )
    _check_submitter(principal, _load(ticket.profile, what), what)
