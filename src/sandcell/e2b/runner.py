"""Running a cell in an E2B sandbox for its tenant: the quota, a worker thread, the mapping of
the run to the tenant, and its live output.

Every E2B call that touches the sandbox (code, a command, a file operation) is one cell, so it
is admitted by the tenant's runs-per-minute quota, gated by the profile and recorded as a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sandcell.e2b.errors import E2BError
from sandcell.e2b.registry import E2BSandbox
from sandcell.live_output import OutputListener
from sandcell.service.core import Service
from sandcell.service.tenants import Tenant
from sandcell.sessions import Session
from sandcell.spec import RunResult

__all__ = [
    "OutputListener",
    "admit_cell",
    "run_cell",
    "run_in_sandbox",
    "tenant_of",
]


def tenant_of(service: Service, box: E2BSandbox) -> Tenant:
    tenant = service.tenants.by_id(box.tenant)
    if tenant is None:
        raise E2BError(401, "the tenant of this sandbox no longer exists")
    return tenant


def admit_cell(service: Service, box: E2BSandbox) -> Tenant:
    """Take the quota for one cell of ``box`` (429 over it); the tenant."""
    tenant = tenant_of(service, box)
    service.admit(tenant, sandbox=False)
    return tenant


async def run_in_sandbox(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    call: Callable[[Session, dict[str, Any]], RunResult],
    *,
    on_output: OutputListener | None = None,
) -> RunResult:
    """Run ``call(session, extra)`` on a worker thread (quota already taken) and map its run to
    the tenant; ``extra`` holds the keywords for :meth:`Session.run` (the live listener)."""
    extra: dict[str, Any] = {}
    if on_output is not None:
        extra["on_output"] = on_output
    began = time.monotonic()
    result: RunResult = await service.in_thread(lambda: call(box.session, extra), session=True)
    service.own_result(tenant.id, result)
    service.metrics.finished(result.outcome.value, time.monotonic() - began)
    return result


async def run_cell(
    service: Service,
    tenant: Tenant,
    box: E2BSandbox,
    code: str,
    *,
    timeout_s: float | None = None,
    exports: tuple[str, ...] = (),
    on_output: OutputListener | None = None,
) -> RunResult:
    """One Python cell in ``box``'s session."""

    def call(session: Session, extra: dict[str, Any]) -> RunResult:
        run: Callable[..., RunResult] = session.run
        return run(code, timeout_s=timeout_s, exports=exports, **extra)

    return await run_in_sandbox(service, tenant, box, call, on_output=on_output)
