"""Picking a paused question up again: its stored state, the decision, and the approved result.

``sandcell approve ID`` (:meth:`~sandcell.executor.Executor.run_approved`) runs the held program
and records its result; resuming reads that result back from the run record, so the program runs
exactly once, when and where the person approved it. A conversation resumes only after the
decision (``ran`` or ``denied``), and only once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandcell.agent._observe import result_from_record
from sandcell.agent._task import Task, task_from_state
from sandcell.agent.budget import Budget
from sandcell.agent.paused import PAUSED_FILENAME, PausedStore, ResumeError
from sandcell.policy.profiles import Profile
from sandcell.spec import RunResult

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.policy.approvals import Ticket

__all__ = ["Decided", "decided"]


@dataclass(frozen=True, slots=True)
class Decided:
    task: Task
    """The question as it stood when it stopped; its last attempt is the held one."""
    ticket: Ticket
    result: RunResult | None
    """The approved run's result; None when the approval was denied."""

    @property
    def decision(self) -> str:
        """Who decided, and why when they said: ``alice: not today``."""
        t = self.ticket
        return f"{t.decided_by}" + (f": {t.decision_reason}" if t.decision_reason else "")


def decided(
    executor: Executor, approval_id: str, *, profile: Profile, budget: Budget | None
) -> Decided:
    """Claim the conversation waiting for ``approval_id`` once the approval is decided.

    Raises ResumeError (ApprovalError for an unknown id) when there is nothing to resume yet.
    """
    ticket = executor.approvals.get(approval_id)
    with PausedStore(executor.approvals.path.parent / PAUSED_FILENAME) as store:
        paused = store.get(ticket.id)
        paused.ensure_waiting()
        if ticket.status == "pending":
            raise ResumeError(
                f"approval {ticket.id} is still pending: decide it first (sandcell approve "
                f"{ticket.id}, or sandcell deny {ticket.id} --reason '...'), then resume"
            )
        if ticket.status == "approved":
            raise ResumeError(
                f"approval {ticket.id} was approved by {ticket.decided_by} but its run has not "
                "finished; resume once `sandcell approve` has reported"
            )
        task = task_from_state(paused.state, profile=profile, budget=budget)
        result = None
        if ticket.status == "ran":
            entry = executor.audit.get(ticket.run_id or "")
            if entry is None:
                raise ResumeError(
                    f"the record of run {ticket.run_id} (approval {ticket.id}) is not in the "
                    f"audit log {executor.audit.path}"
                )
            result = result_from_record(entry.record)
        store.claim(ticket.id)
    return Decided(task, ticket, result)
