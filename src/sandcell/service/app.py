"""The ASGI application: FastAPI over one :class:`~sandcell.service.core.Service`.

:func:`create_app` is the factory every later surface mounts onto (``/mcp``, ``/ui``): it takes a
ready service, so tests and embedders choose its executor, and ``sandcell serve`` builds one
with :func:`make_service`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.routing import Route

from sandcell.service import (
    api_ops,
    api_ports,
    api_processes,
    api_records,
    api_runs,
    api_saved_sessions,
    api_sessions,
    api_tool_approvals,
)
from sandcell.service.core import Service, ServiceConfig
from sandcell.service.mcp_mount import MCP_PATH
from sandcell.service.problems import BodyLimit, install_handlers
from sandcell.service.replica import ReplicaWatch

if TYPE_CHECKING:
    from sandcell.cluster import Cluster as Placement

__all__ = ["API_VERSION", "StartMode", "create_app", "make_service"]

log = logging.getLogger("sandcell.service")
API_VERSION = "1"
StartMode = Literal["pool", "template", "cold"]


def make_service(
    config: ServiceConfig,
    *,
    backend: str | None = None,
    start: StartMode = "cold",
    pool_size: int = 4,
    cluster: Placement | None = None,
) -> Service:
    """A service with its one executor on ``config.home`` (``backend``: the rung every run
    must get, else each profile's own; ``start``: how namespaces runs of Python start).
    ``cluster``: runs go to its nodes (:class:`sandcell.cluster.Cluster`, whose warm starts
    are its nodes' own, so ``start`` does not apply here); its owner closes it."""
    from sandcell.executor import Executor

    if cluster is not None:
        service = Service(config, Executor(home=config.home, backend=backend, cluster=cluster))
        service.use_cluster(cluster)
        return service
    warm = None
    if start != "cold":
        from sandcell.backends.warm import WarmConfig

        warm = WarmConfig(mode=start, pool_size=pool_size)
    executor = Executor(home=config.home, backend=backend, warm=warm)
    return Service(config, executor)


def create_app(service: Service, *, mcp: bool = True) -> FastAPI:
    """The application serving ``service``; leaving its lifespan drains the runs in flight,
    ends the sessions and closes the executor. ``mcp``: serve the MCP server at ``/mcp``
    for the same tenants (when the MCP SDK is installed)."""
    mcp_app = _mcp_app(service) if mcp else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watch = ReplicaWatch(service, service.replica) if service.replica is not None else None
        async with AsyncExitStack() as stack:
            try:
                if mcp_app is not None:
                    # Starlette runs only the outer app's lifespan, not a routed app's: the
                    # MCP SDK's session manager starts (and stops) here.
                    await stack.enter_async_context(mcp_app.router.lifespan_context(mcp_app))
                if watch is not None:
                    watch.start()
                yield
            finally:
                await stack.aclose()  # MCP first: its sessions end, its calls stop coming
                await service.drain()
                if watch is not None:  # after the drain: its runs count until they end
                    await watch.stop()
                service.close()

    app = FastAPI(
        title="sandcell",
        version=API_VERSION,
        summary="Run untrusted code in disposable sandboxes under a policy, with a record of "
        "every run.",
        lifespan=lifespan,
        # Swagger UI and ReDoc load their scripts from a CDN (blank offline); /docs is a
        # server-rendered page of the same document instead (docs_page).
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    install_handlers(app)
    for module in (
        api_runs,
        api_sessions,
        api_saved_sessions,
        api_processes,
        api_ports,
        api_records,
        api_tool_approvals,
        api_ops,
    ):
        app.include_router(module.router)
    from sandcell.service import api_replay

    app.include_router(api_replay.router)
    app.add_middleware(BodyLimit, max_bytes=service.config.max_body_bytes)
    from sandcell.service.docs_page import docs_route
    from sandcell.service.ui import mount_ui

    mount_ui(app, service)  # /ui: the approval pages
    from sandcell.e2b import E2B_PATH
    from sandcell.e2b.app import e2b_app

    e2b = e2b_app(service)
    app.mount(E2B_PATH, e2b)  # /e2b: E2B's API, for the official E2B SDKs
    # /files: where the E2B SDK points its signed download and upload URLs (they drop the
    # /e2b of E2B_SANDBOX_URL), the same files endpoints as /e2b/files (sandcell.e2b.signed_urls).
    app.router.routes.append(Route("/files", endpoint=e2b, methods=["GET", "POST"]))
    from sandcell.service.authenticate import AuthenticateFirst

    # Added after BodyLimit, so outside it: a request's key (an E2B sandbox's token) is checked
    # before BodyLimit reads its body.
    app.add_middleware(AuthenticateFirst, service=service, e2b_reached=e2b.state.registry.reached)
    from sandcell.e2b.port_hosts import PortHosts

    # Outermost: E2B's get_host() names (PORT-SANDBOXID.domain) go to the sandbox's port, with
    # its token checked before the body is read; every other request goes on as before.
    app.add_middleware(
        PortHosts,
        service=service,
        registry=e2b.state.registry,
        max_body=service.config.max_body_bytes,
    )
    if service.replica is not None:
        from sandcell.service.forwarding import OwnerForwarding

        # Outermost of all: a request for what another replica holds goes there before
        # anything here looks for it (the owner authenticates it).
        app.add_middleware(OwnerForwarding, replica=service.replica, holds=service.holds)
    app.router.routes.append(docs_route(app))
    if mcp_app is not None:
        # The MCP app as the ASGI endpoint of exactly /mcp, not a mount: it keeps its own path
        # (a mount at /mcp would answer /mcp/mcp) and its own authentication, and every other
        # path still gets the service's problem+json 404 and 405.
        app.router.routes.append(Route(MCP_PATH, endpoint=mcp_app, include_in_schema=False))
    return app


def _mcp_app(service: Service) -> Starlette | None:
    from sandcell.service.mcp_mount import LOOPBACK_HOSTS, mcp_app

    try:
        return mcp_app(service, allowed_hosts=(*LOOPBACK_HOSTS, *service.config.allowed_hosts))
    except ImportError as exc:
        if not (exc.name or "").startswith(("mcp", "mcp_types")):
            raise
        log.warning("no MCP at /mcp: the MCP SDK is missing; pip install 'sandcell[tools]'")
        return None


def default_socket(home: Path) -> Path:
    """The service's local socket in the sandcell home."""
    return home / "service.sock"
