"""The approval queue as a tool gateway's approver: a person decides from another terminal.

A governed call that needs approval becomes a pending tool ticket in the approval store
(:meth:`~sandcell.policy.approvals.ApprovalStore.submit_tool`); the call waits, polling the store,
until someone runs ``sandcell approve ID`` or ``sandcell deny ID --reason ...``, or until its
deadline, when the ticket is marked ``expired`` and the call refused. The executor gives every
run this approver unless its caller passed ``tool_approver=``.

Deadlines: the gateway stops waiting for its approver after the approval timeout (the run's wall
time); the ticket expires a little before that (:func:`ticket_lifetime`), so that a person who
approves sees either an approval the call used or a refusal, never an approval nobody waited for.
When the run ends first (its wall time killed the program while the call waited),
:meth:`QueueApprover.close` expires the tickets still pending.

What comes back is checked against what was asked: a ticket whose tool, profile, stored
arguments or their hash differ from the call's (the store edited by hand) is not an approval of
this call. The ticket keeps the complete arguments, the exact text the gateway will send.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from sandcell.errors import ConfigError
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.run_sockets import RunSockets
from sandcell.tools.approval import ApprovalDecision, ApprovalRequest, Approver, NoApproval

if TYPE_CHECKING:
    from sandcell.network.addresses import Resolver
    from sandcell.policy.approvals import ApprovalStore
    from sandcell.policy.profiles import Profile

__all__ = ["QueueApprover", "open_run_sockets", "ticket_lifetime"]

POLL_S = 0.2
"""How often a waiting call looks at the store (a read of one row)."""
RUN_ENDED = "the run ended before anyone decided"
_RECORD_WAIT_S = 2.0
"""How long closing waits for the gateway to record the calls it woke (microseconds, normally)."""


def ticket_lifetime(timeout_s: float) -> float:
    """How long a ticket stays approvable when the gateway waits ``timeout_s``: a margin less,
    so that the ticket is settled (decided or expired) before the gateway gives up on it."""
    margin = min(1.0, timeout_s / 10)
    return max(timeout_s - margin, 0.0)


class QueueApprover:
    """An :data:`~sandcell.tools.approval.Approver` that files each call in ``store`` and waits.

    One per run (or session): :meth:`close` expires what it still waits for. Thread-safe (the
    gateway serves several calls at once).
    """

    def __init__(
        self,
        store: ApprovalStore,
        *,
        timeout_s: float,
        run_id: str | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        """``timeout_s``: the approval timeout the gateway was given (see the module)."""
        if not timeout_s > 0:
            raise ConfigError(f"the approval timeout must be positive, got {timeout_s!r}")
        self.store = store
        self.timeout_s = timeout_s
        self.run_id = run_id
        self._poll_s = poll_s
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._waiting: set[str] = set()
        self._idle = threading.Condition(self._lock)

    def __call__(self, request: ApprovalRequest) -> ApprovalDecision | None:
        """File ``request`` and wait for the decision: an :class:`ApprovalDecision`, or None
        when the ticket expired (nobody decided in time, or the run ended)."""
        if self._closed.is_set():
            raise NoApproval(RUN_ENDED)
        lifetime = ticket_lifetime(self.timeout_s)
        ticket = self.store.submit_tool(
            profile=request.profile,
            tool=request.tool,
            args=request.args,
            expires_in_s=lifetime,
            run_id=self.run_id,
        )
        with self._lock:
            self._waiting.add(ticket.id)
        try:
            return self._wait(ticket, request, time.monotonic() + lifetime)
        finally:
            with self._lock:
                self._waiting.discard(ticket.id)
                self._idle.notify_all()

    def close(self, reason: str = RUN_ENDED) -> int:
        """Expire every ticket still pending and wake the calls waiting on them (they return
        None, promptly); how many calls were waiting. Later calls return None at once.
        Idempotent."""
        self._closed.set()
        with self._lock:
            pending = sorted(self._waiting)
        for id_ in pending:
            self.store.expire_tool(id_, reason=reason)
        with self._lock:
            self._idle.wait_for(lambda: not self._waiting, timeout=5 * self._poll_s + 1.0)
        return len(pending)

    def _wait(
        self, ticket: ToolTicket, request: ApprovalRequest, deadline: float
    ) -> ApprovalDecision | None:
        while True:
            ticket = self.store.get_tool(ticket.id)
            if ticket.status in ("approved", "denied"):
                return _decision(ticket, request)
            if ticket.status == "expired":
                # close() may have expired it while this poll read the store: the run's end is
                # then the reason, not an expiry nobody explained.
                self._after_expiry(ticket.id)
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                settled = self.store.expire_tool(
                    ticket.id, reason=f"nobody decided within {ticket_lifetime(self.timeout_s):g} s"
                )
                if settled.status in ("approved", "denied"):  # decided at the last moment
                    return _decision(settled, request)
                self._after_expiry(ticket.id)
                return None
            if self._closed.wait(min(self._poll_s, left)):
                # The run is over: nothing goes ahead for a program that is gone, even if a
                # decision landed in the last poll (an upstream call now would be a consequence
                # nobody asked for any more).
                self.store.expire_tool(ticket.id, reason=RUN_ENDED)
                raise _run_ended(ticket.id)

    def _after_expiry(self, ticket_id: str) -> None:
        """Nobody decided: the gateway is about to give up on its own (ticket_lifetime left it a
        margin); wait for that, so its refusal says the approval timed out, or for the run's
        end, which is then the reason given (NoApproval). The caller returns None (nobody
        approved)."""
        if self._closed.wait(2 * (self.timeout_s - ticket_lifetime(self.timeout_s)) + self._poll_s):
            raise _run_ended(ticket_id)


def _run_ended(ticket_id: str) -> NoApproval:
    return NoApproval(f"approval {ticket_id} expired: {RUN_ENDED}")


def _decision(ticket: ToolTicket, request: ApprovalRequest) -> ApprovalDecision | None:
    """The decision of ``ticket``, if it is a decision about exactly ``request``: the stored
    arguments are byte for byte the call's and still hash to the ticket's sha256."""
    if (ticket.tool, ticket.profile, ticket.args_sha256, ticket.args_json) != (
        request.tool,
        request.profile,
        request.args_sha256,
        request.args_json,
    ) or not ticket.intact:
        # Not something `sandcell approve` can produce: the row was changed in the file.
        return None
    return ApprovalDecision(
        approved=ticket.status == "approved",
        approver=f"{ticket.decided_by} (approval {ticket.id})",
        args_sha256=ticket.args_sha256,
    )


def _settle(queue: QueueApprover) -> Callable[[RunSockets], None]:
    """What closing the run's sockets does first: a call still waiting is answered (its ticket
    expires), and the gateway records it as refused before its report is taken; otherwise the
    record would miss it."""

    def settle(sockets: RunSockets) -> None:
        before = sockets.tool_calls
        woken = queue.close()
        until = time.monotonic() + _RECORD_WAIT_S
        while sockets.tool_calls < before + woken and time.monotonic() < until:
            time.sleep(0.01)

    return settle


def open_run_sockets(
    profile: Profile,
    *,
    store: ApprovalStore,
    approver: Approver | None,
    approval_timeout_s: float,
    resolver: Resolver | None = None,
    run_id: str | None = None,
    environ: Mapping[str, str] | None = None,
    ingress: bool = False,
) -> RunSockets | None:
    """:meth:`RunSockets.open`, with a :class:`QueueApprover` on ``store`` when ``approver`` is
    None; its tickets expire when the sockets close. ``ingress``: a session's ports too.

    Raises:
        ConfigError: a tool's credential is not set on the host.
        InfraError: a socket could not be served.
    """
    if approver is not None or not profile.tools:
        return RunSockets.open(
            profile,
            approver=approver,
            approval_timeout_s=approval_timeout_s,
            resolver=resolver,
            environ=environ,
            ingress=ingress,
        )
    queue = QueueApprover(store, timeout_s=approval_timeout_s, run_id=run_id)
    return RunSockets.open(
        profile,
        approver=queue,
        approval_timeout_s=approval_timeout_s,
        resolver=resolver,
        environ=environ,
        before_close=_settle(queue),
        ingress=ingress,
    )
