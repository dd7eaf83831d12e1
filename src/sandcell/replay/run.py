"""Replay a recorded run: check the log, plan, run through the policy gate, compare.

The replay is a run of its own: it goes through :meth:`Executor.run` like any other, so the
profile decides again (a run that needed approval needs it again: a replay never bypasses an
approval), and its record carries ``replay_of`` (the original's id) and ``replay`` (what was not
reproduced exactly). The audit log's hash chain is verified first: a replay refuses a log with any
problem, since an edited record would make it re-run what never ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandcell.errors import ConfigError
from sandcell.replay.compare import Comparison, compare_records
from sandcell.replay.plan import ReplayPlan, ReplayRefused, build_plan
from sandcell.spec import Outcome, RunResult

if TYPE_CHECKING:
    from sandcell.audit import AuditLog
    from sandcell.executor import Executor
    from sandcell.live_output import OutputListener


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayReport:
    """What a replay ran, and how its result compares with the original's."""

    plan: ReplayPlan
    result: RunResult
    """The replay's own run (recorded under ``result.run_id``)."""
    comparison: Comparison
    pending: str | None = None
    """Why the replay has not run yet (waiting for approval, denied); None when it ran."""

    @property
    def matched(self) -> bool:
        """Whether the replay ran and every result field equals the original's."""
        return self.pending is None and self.comparison.matched

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``sandcell audit replay --json``)."""
        return {
            "original_run_id": self.plan.run_id,
            "replay_run_id": self.result.run_id,
            "matched": self.matched,
            "pending": self.pending,
            "exact": self.plan.exact,
            "backend": self.plan.backend,
            "recorded_backend": self.plan.recorded_backend,
            "profile": {
                "name": self.plan.profile.name,
                "sha256": self.plan.profile.sha256,
                "current": self.plan.profile_changed,
            },
            "runtime_changed": self.plan.runtime_changed,
            "notes": list(self.plan.notes),
            "comparison": self.comparison.to_dict(),
        }


def load_original(audit: AuditLog, run_id: str) -> Mapping[str, object]:
    """The record of ``run_id`` from a log whose hash chain verifies; ReplayRefused otherwise."""
    entry = audit.get(run_id)
    if entry is None:
        raise ReplayRefused(
            f"no run {run_id!r} in the audit log {audit.path}; list the runs with "
            "sandcell audit list"
        )
    report = audit.verify()
    if not report.ok:
        # Kinds and positions only: on the service the log holds other tenants' runs, whose
        # ids must not show in this tenant's error.
        shown = ", ".join(f"{p.kind} at seq {p.seq}" for p in report.problems[:3])
        more = f" and {len(report.problems) - 3} more" if len(report.problems) > 3 else ""
        raise ReplayRefused(
            f"the audit log fails verification ({shown}{more}), so its records "
            "cannot be trusted to say what ran; nothing is replayed from it. See sandcell audit "
            "verify"
        )
    return entry.record


def replay(
    executor: Executor,
    run_id: str,
    *,
    use_current_profile: bool = False,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
    on_output: OutputListener | None = None,
    run_id_of_replay: str | None = None,
) -> ReplayReport:
    """Replay the recorded run ``run_id`` with ``executor`` and compare (see the module
    docstring). ``backend`` overrides the recorded backend (the record says so); without it the
    executor must run the profile on the recorded one; ``run_id_of_replay`` names the replay's
    own run (default: a fresh id). Raises ReplayRefused when the run cannot
    be replayed as recorded; ConfigError and IsolationUnavailable as :meth:`Executor.run` does."""
    original = load_original(executor.audit, run_id)
    plan = build_plan(
        original,
        store=executor.store,
        wheels=executor.wheels,
        use_current_profile=use_current_profile,
        backend=backend,
        env=env,
    )
    chosen = executor.backend_for(plan.profile).name
    if chosen != plan.backend:
        recorded = plan.backend == plan.recorded_backend
        raise ReplayRefused(
            f"run {plan.run_id} {'ran' if recorded else 'is to be replayed'} on backend "
            f"{plan.backend!r}, but this executor runs profile {plan.profile.name!r} on "
            f"{chosen!r}; use an executor built with backend={plan.backend!r}"
            + (f", or override with backend={chosen!r}" if recorded else "")
        )
    declared: dict[str, Any] = {
        "schema": plan.schema,
        "invariants": plan.invariants,
        "result_file": plan.result_file,
        "on_output": on_output,
        "run_id": run_id_of_replay,
        "record_extra": plan.record_fields(),
    }
    if plan.workdir is not None:
        from sandcell.changes.run import rerun_in_workdir

        try:
            result = rerun_in_workdir(
                executor, plan.request, plan.workdir, plan.profile, **declared
            )
        except ConfigError as exc:
            raise ReplayRefused(
                f"the working directory of run {plan.run_id} cannot be rebuilt: {exc}"
            ) from None
    else:
        result = executor.run(plan.request, profile=plan.profile, **declared)
    entry = executor.audit.get(result.run_id)
    replayed = entry.record if entry is not None else {}
    pending = None
    if result.outcome is Outcome.AWAITING_APPROVAL:
        pending = (
            f"the replay waits for approval, as any run under profile {plan.profile.name!r} "
            f"with this code: {result.reason}; once approved, its record links to run "
            f"{plan.run_id} (replay_of) and sandcell audit compare {plan.run_id} RUN_ID compares"
        )
    elif result.outcome is Outcome.DENIED and original.get("outcome") != Outcome.DENIED.value:
        pending = f"the replay was denied: {result.reason}"
    return ReplayReport(
        plan=plan,
        result=result,
        comparison=compare_records(original, replayed),
        pending=pending,
    )
