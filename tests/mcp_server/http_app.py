"""Serves ``sandcell.mcp.streamable_http_app`` with uvicorn on an inherited listening socket:
``python http_app.py HOME FD [TENANTS_JSON]``; the test binds a free loopback port and passes
the socket. ``TENANTS_JSON`` (``{"KEY": ["TENANT", [PROFILE, ...]]}``) turns on bearer keys."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import uvicorn

from sandcell import Executor
from sandcell.mcp import McpSettings, streamable_http_app


class OverQuota(Exception):
    """Like the service's 429 problem: the reason is in ``detail``."""

    def __init__(self, detail: str) -> None:
        super().__init__(429)
        self.detail = detail


def main() -> None:
    home, fd = Path(sys.argv[1]), int(sys.argv[2])
    raw: dict[str, tuple[str, list[str]]] = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    tenants = {key: str(tenant) for key, (tenant, _) in raw.items()}
    profiles = {str(tenant): [str(p) for p in names] for tenant, names in raw.values()}

    def authenticate(key: str) -> str | None:
        return tenants.get(key)

    def tenant_profiles(tenant: str) -> Sequence[str]:
        return profiles.get(tenant, [])

    @contextlib.contextmanager
    def admit(tenant: str | None, what: str) -> Iterator[None]:
        # A stand-in for the service's quotas: tenant "beta" has no runs left.
        if tenant == "beta":
            raise OverQuota("over quota: 0 runs left this minute; retry after 7 s")
        yield

    with Executor(home=home) as ex:
        if tenants:
            settings = McpSettings(artifacts="own", tenant_profiles=tenant_profiles, admit=admit)
            app = streamable_http_app(ex, settings, authenticate=authenticate)
        else:
            app = streamable_http_app(ex)
        uvicorn.run(app, fd=fd, log_level="warning")


if __name__ == "__main__":
    main()
