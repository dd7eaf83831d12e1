"""E2B's ``get_host(port)``: ``f"{port}-{sandbox_id}.{domain}"`` reaches a server the sandbox's
program started on that port, as on E2B's own cloud.

:class:`PortHosts` sits in front of the whole service: a request whose ``Host`` is
``PORT-SANDBOXID.<anything>`` (point a wildcard DNS name at the service and set ``E2B_DOMAIN``
to it) goes to ``127.0.0.1:PORT`` in that sandbox (:mod:`sandcell.service.port_proxy`), only
on its profile's ``[ingress] ports``, and only with the sandbox's access token in
``X-Access-Token`` or ``E2B-Traffic-Access-Token`` (the envd token the create answer gave):
without it 401, for a sandbox that is gone 502, both in E2B's ``{"code", "message"}`` shape.
Unlike E2B's cloud no port is public. The envd and interpreter ports (49983, 49999) are not
taken here: their traffic is the E2B API's own. Every connection is recorded in the sandbox's
session with its tenant as ``by``. A body is read only once the token matched, and at most the
service's body limit.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sandcell.e2b.errors import E2BError, json_error
from sandcell.e2b.registry import SandboxRegistry
from sandcell.service.core import Service
from sandcell.service.port_proxy import proxy
from sandcell.service.problems import ServiceProblem

__all__ = ["PortHosts", "port_host"]

API_PORTS = frozenset({49983, 49999})
"""envd's and the interpreter's: served by the E2B API itself, never forwarded."""
_HOST = re.compile(r"^(\d{1,5})-([0-9a-z]{8,64})\.", re.ASCII)


def port_host(host: str) -> tuple[int, str] | None:
    """(port, sandbox id) of a ``PORT-SANDBOXID.domain`` host, or None."""
    found = _HOST.match(host.lower())
    if found is None:
        return None
    port = int(found.group(1))
    if not 0 < port < 65536 or port in API_PORTS:
        return None
    return port, found.group(2)


class PortHosts:
    """ASGI middleware: port hosts to the sandbox (see the module), everything else on."""

    def __init__(
        self, app: ASGIApp, *, service: Service, registry: SandboxRegistry, max_body: int
    ) -> None:
        self.app = app
        self.service = service
        self.registry = registry
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        target = port_host(request.headers.get("host", ""))
        if target is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await self._forward(request, *target)
        except E2BError as err:
            response = json_error(err)
        except ServiceProblem as problem:
            response = json_error(E2BError(problem.status, problem.detail))
        await response(scope, receive, send)

    async def _forward(self, request: Request, port: int, sandbox_id: str) -> Response:
        token = request.headers.get("x-access-token") or request.headers.get(
            "e2b-traffic-access-token"
        )
        box = self.registry.reached(sandbox_id, token)
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            raise E2BError(413, f"the request body is over {self.max_body} bytes")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise E2BError(413, f"the request body is over {self.max_body} bytes")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return await proxy(
            self.service,
            box.session,
            port,
            method=request.method,
            target=target,
            headers=request.headers,
            body=body,
            by=box.tenant,
        )
