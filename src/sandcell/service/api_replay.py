"""``POST /v1/runs/{id}/replay``: run one of the tenant's recorded runs again and compare.

The replay is :meth:`Executor.replay` (see :mod:`sandcell.replay`) on the service's executor:
a run of the tenant's own, under the recorded profile (which must still be one of the tenant's),
through the same gate and quota as any run, answered when it has finished. A run of another
tenant is a 404, as everywhere else; a run that cannot be replayed as recorded is a 400 saying
why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandcell.replay import ReplayReport
from sandcell.service.api_runs import status_json, wait_for
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.fast_json import FastJSONResponse
from sandcell.service.models import Problem
from sandcell.service.problems import ServiceProblem
from sandcell.spec import RunResult

__all__ = ["router"]

router = APIRouter(prefix="/v1/runs", tags=["runs"])
_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {"application/problem+json": {}}}
    for code in (400, 401, 403, 404, 429, 503)
}


class ReplayBody(BaseModel):
    """What may differ from the recorded run, said explicitly (and recorded with the replay)."""

    model_config = ConfigDict(extra="forbid")

    use_current_profile: bool = Field(
        default=False, description="replay under the profile as it is now if it changed"
    )
    backend: str | None = Field(
        default=None, description="the rung to replay on instead of the recorded one"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="values of the run's environment variables (never recorded)",
    )


@router.post("/{run_id}/replay", responses=_PROBLEMS)
async def replay_run(
    run_id: str,
    request: Request,
    service: ServiceDep,
    tenant: CurrentTenant,
    body: ReplayBody | None = None,
) -> JSONResponse:
    """Run a recorded run of this tenant again as recorded; the answer is the replay's run and
    the comparison (``replay``: matched, what differed, notes)."""
    asked = body or ReplayBody()
    entry = service.executor.audit.get(run_id)
    if entry is None or not service.tenants.owns(tenant.id, "run", entry.run_id):
        raise ServiceProblem(404, f"no run {run_id!r}")
    service.profile_for(tenant, _profile_name(entry.record))
    service.admit(tenant, sandbox=True)
    state = service.new_run(tenant)
    reports: list[ReplayReport] = []

    def call(new_id: str) -> RunResult:
        report = service.executor.replay(
            entry.run_id,
            use_current_profile=asked.use_current_profile,
            backend=asked.backend,
            env=asked.env,
            run_id_of_replay=new_id,
        )
        reports.append(report)
        return report.result

    service.start(state, call)
    await wait_for(request, service, state)
    return FastJSONResponse({**status_json(state), "replay": reports[0].to_dict()})


def _profile_name(record: Mapping[str, object]) -> str:
    policy = record.get("policy")
    profile = policy.get("profile") if isinstance(policy, Mapping) else None
    name = profile.get("name") if isinstance(profile, Mapping) else None
    if not isinstance(name, str):
        raise ServiceProblem(400, "the run's record names no profile; it cannot be replayed")
    return name
