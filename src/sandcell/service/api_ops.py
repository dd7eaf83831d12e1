"""Health, metrics, and the caller's own tenant."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from sandcell.service.api_runs import _PROBLEMS
from sandcell.service.core import Service
from sandcell.service.deps import CurrentTenant, ServiceDep
from sandcell.service.kept_bytes import state_bytes
from sandcell.service.metrics import CONTENT_TYPE, check_metrics_access
from sandcell.service.models import HealthBody, TenantBody
from sandcell.service.problems import STORE_RETRY_AFTER_S

__all__ = ["router"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandcell")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


_VERSION = _version()

router = APIRouter(tags=["operations"])


def _health(service: Service) -> HealthBody:
    service.reap_sessions()
    return HealthBody(
        status="draining" if service.draining else "ok",
        version=_VERSION,
        runs_in_flight=service.in_flight(),
        sessions=len(service.sessions),
        replica=None if service.replica is None else service.replica.id,
    )


@router.get(
    "/healthz",
    response_model=HealthBody,
    responses={
        503: {
            "model": HealthBody,
            "description": "the shared database, or the Ray cluster, is unreachable",
        }
    },
)
async def healthz(service: ServiceDep) -> HealthBody | JSONResponse:
    """Ready: up, or draining (a graceful stop waits for runs in flight); 503 for a replica
    that cannot reach its shared database, or the Ray cluster its runs go to (a load balancer
    then sends requests elsewhere). No key needed. It runs no query: the replica's heartbeat
    uses the database every few seconds and the cluster's refresh probes its head every
    second; their last outcomes are what is told here."""
    body = _health(service)
    down = None if service.replica is None else service.replica.unreachable
    lost = None if service.cluster is None else service.cluster.unreachable
    if down is not None:
        body.status = "database_unreachable"
        body.detail = f"the shared database is unreachable: {down}"
    elif lost is not None:
        body.status = "cluster_unreachable"
        body.detail = f"{lost}; this replica connects again once it answers"
    else:
        return body
    return JSONResponse(
        body.model_dump(), status_code=503, headers={"Retry-After": str(STORE_RETRY_AFTER_S)}
    )


@router.get("/livez", response_model=HealthBody)
async def livez(service: ServiceDep) -> HealthBody:
    """Alive: /healthz's body, answered 200 while the shared database is unreachable too (for
    a liveness probe: restarting every replica for an outage would end the runs that wait it
    out; /healthz is for readiness). No key needed."""
    return _health(service)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request, service: ServiceDep) -> PlainTextResponse:
    """Prometheus metrics: runs by outcome, latency, runs in flight, queue, sessions, pools.
    Only for the operator: from a loopback address or the local socket, or, where the service
    has a metrics key (``sandcell serve --metrics-key-file``), with ``Authorization: Bearer``
    that key, from anywhere (and then only so). Tenant keys do not open it: it names the
    profiles in use across tenants."""
    check_metrics_access(request, service.config.metrics_key_sha256)
    return PlainTextResponse(service.metrics.render(service.gauges), media_type=CONTENT_TYPE)


@router.get("/v1/tenant", response_model=TenantBody, responses=_PROBLEMS)
async def whoami(service: ServiceDep, tenant: CurrentTenant) -> TenantBody:
    """The caller's tenant: its profiles, its quotas and what it uses of them now."""
    return TenantBody(
        **{k: v for k, v in tenant.to_dict().items()},  # type: ignore[arg-type]
        in_flight=service.quotas.holding(tenant.id),
        cpu_seconds_today=service.tenants.cpu_ms_today(tenant.id) / 1000.0,
        stored_bytes=service.tenants.stored_bytes(tenant.id)
        + state_bytes(service.executor, tenant.id),
    )
