"""``/mcp`` on the service: the MCP server (streamable HTTP) over the service's own executor.

A tenant's API key is its MCP bearer token; its profiles are the ones an MCP client may name
(its default first); its quotas admit every tool call that runs code, exactly as for
``/v1``; everything a call made (records, approvals, artifacts, CPU used) is mapped to the
tenant in the service's table, so ``/v1/audit`` and ``/v1/approvals`` show it and the quotas
count it. A session opened over MCP holds one of the tenant's sandbox slots until it ends
(closed, idle, out of lifetime, or its MCP connection gone). Artifacts are scoped by the MCP
server itself (``artifacts="own"``: only those of runs it made for the same tenant).

The MCP client is the tenant's submitter: it is asked to approve its own held run only where
the run's profile says ``submitter_may_approve``; otherwise the run waits for one of the
tenant's approvers (``/v1/approvals``, ``/ui``). The MCP server knows a client by its tenant's
id (:attr:`Tenant.id`), never by the name.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from sandcell.errors import ConfigError
from sandcell.policy.approvals import Ticket
from sandcell.service.approving import check_may_approve_run
from sandcell.service.core import LiveSession, Service
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Principal, Tenant
from sandcell.sessions import Session
from sandcell.spec import RunResult

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["LOOPBACK_HOSTS", "MCP_PATH", "mcp_app"]

MCP_PATH = "/mcp"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Host names ``/mcp`` answers (with or without a port) unless told others: the SDK's
protection against DNS rebinding, where a web page makes a browser talk to a local server."""


class _TenantHooks:
    """The MCP server's ``admit`` and ``made`` hooks over the service's quotas and table.

    Both run on the tool call's worker thread, ``made`` inside ``admit``'s context: the
    thread-local state carries the sandbox slot a ``session`` admission took until ``made``
    hands it to the session it opened (or the context gives it back: nothing opened)."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._local = threading.local()

    @contextlib.contextmanager
    def admit(self, tenant_id: str | None, what: str) -> Iterator[None]:
        if tenant_id is None:  # authentication is always on for /mcp; never without a key
            raise ConfigError("this MCP endpoint needs a tenant's API key")
        tenant = _tenant(self._service, tenant_id)  # its quotas as they are now
        if what == "save":
            # A pause's save: it starts nothing; refused once the stored bytes are spent.
            self._service.quotas.check_stored(tenant, 0)
            yield
            return
        holds = what in ("run", "session")
        # A ServiceProblem (429) here refuses the call; the MCP server shows its detail.
        self._service.admit(tenant, sandbox=holds)
        self._local.slot = holds
        self._local.began = time.monotonic()
        try:
            yield
        finally:
            if self._local.slot:
                self._service.quotas.release(tenant.id)
            self._local.slot = False
            self._local.began = None

    def made(self, tenant_id: str | None, made: RunResult | Session) -> None:
        if tenant_id is None:
            return
        service = self._service
        if isinstance(made, Session):
            # The slot admit took is the session's now, given back when it ends.
            self._local.slot = False
            live = LiveSession(
                tenant=tenant_id,
                session=made,
                inputs_dir=None,
                surface="mcp",
                key_sha256=_tenant(service, tenant_id).key_sha256,
            )
            try:
                service.add_session(live)
            except BaseException:
                # Not held, not kept: the MCP server never sees this session either.
                with contextlib.suppress(Exception):
                    made.close()
                service.end_session(live)
                raise
            return
        service.own_result(tenant_id, made)
        began = getattr(self._local, "began", None)
        if began is not None:
            service.metrics.finished(made.outcome.value, time.monotonic() - began)


def _tenant(service: Service, tenant_id: str) -> Tenant:
    tenant = service.tenants.by_id(tenant_id)
    if tenant is None:
        raise ConfigError("this tenant was removed; its API key no longer works")
    return tenant


def _may_approve(service: Service, tenant_id: str | None, ticket: Ticket) -> str | None:
    """Why the MCP client (the tenant's submitter) may not decide ``ticket``, or None."""
    tenant = None if tenant_id is None else service.tenants.by_id(tenant_id)
    if tenant is None:
        return "this tenant was removed; its API key no longer works"
    try:
        check_may_approve_run(Principal(tenant=tenant, role="submitter"), ticket)
    except ServiceProblem as exc:
        return (
            f"approval {ticket.id} is pending: {exc.detail}. An approver decides it at "
            f"/v1/approvals/{ticket.id} or in /ui"
        )
    return None


def _hosts(names: Sequence[str]) -> list[str]:
    return [form for name in names for form in (name, f"{name}:*")]


def mcp_app(service: Service, *, allowed_hosts: Sequence[str] = LOOPBACK_HOSTS) -> Starlette:
    """The MCP server for ``service``'s tenants, answering at ``/mcp``: route exactly that
    path to it and enter its lifespan from the service's (see
    :func:`sandcell.service.app.create_app`). ``allowed_hosts``: the Host names (any port) it
    answers, and the origins (``http://NAME:*``) a browser may call it from."""
    from sandcell.mcp import McpSettings, streamable_http_app

    hooks = _TenantHooks(service)

    def authenticate(key: str) -> str | None:
        tenant = service.tenants.authenticate(key)
        return None if tenant is None else tenant.id

    def tenant_profiles(tenant_id: str) -> Sequence[str]:
        return _tenant(service, tenant_id).profiles

    settings = McpSettings(
        artifacts="own",
        tenant_profiles=tenant_profiles,
        admit=hooks.admit,
        made=hooks.made,
        may_approve=lambda tenant_id, ticket: _may_approve(service, tenant_id, ticket),
    )
    return streamable_http_app(
        service.executor,
        settings,
        path=MCP_PATH,
        allowed_hosts=_hosts(allowed_hosts),
        allowed_origins=[f"http://{h}" for h in _hosts(allowed_hosts)],
        authenticate=authenticate,
    )
