"""Health, metrics, and the caller's own tenant."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.metrics import CONTENT_TYPE
from sandcell.service.models import HealthBody, TenantBody

__all__ = ["router"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandcell")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


_VERSION = _version()

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthBody)
async def healthz(service: ServiceDep) -> HealthBody:
    """Up, or draining (a graceful stop waits for runs in flight). No key needed."""
    service.reap_sessions()
    return HealthBody(
        status="draining" if service.draining else "ok",
        version=_VERSION,
        runs_in_flight=service.in_flight(),
        sessions=len(service.sessions),
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(service: ServiceDep) -> PlainTextResponse:
    """Prometheus metrics: runs by outcome, latency, runs in flight, queue, sessions, pools.
    Totals only, no tenant's data, so no key is needed (bind to loopback, as by default)."""
    return PlainTextResponse(service.metrics.render(service.gauges), media_type=CONTENT_TYPE)


@router.get("/v1/tenant", response_model=TenantBody, responses=_PROBLEMS)
async def whoami(service: ServiceDep, tenant: CurrentTenant) -> TenantBody:
    """The caller's tenant: its profiles, its quotas and what it uses of them now."""
    return TenantBody(
        **{k: v for k, v in tenant.to_dict().items()},  # type: ignore[arg-type]
        in_flight=service.quotas.holding(tenant.name),
        cpu_seconds_today=service.tenants.cpu_ms_today(tenant.name) / 1000.0,
        stored_bytes=service.tenants.stored_bytes(tenant.name),
    )
