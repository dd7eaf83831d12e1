"""sandcell as a long-running service: an HTTP API over the one executor, for many tenants.

``sandcell serve`` runs it; :func:`create_app` builds the ASGI application for a
:class:`Service` (made by :func:`make_service`), so other surfaces can mount onto it. The
application needs the ``service`` extra (FastAPI, uvicorn); the tenant store
(:mod:`sandcell.service.tenants`) does not, so names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandcell.service.app import create_app, make_service
    from sandcell.service.core import Service, ServiceConfig

__all__ = ["Service", "ServiceConfig", "create_app", "make_service"]

_WHERE = {
    "create_app": "sandcell.service.app",
    "make_service": "sandcell.service.app",
    "Service": "sandcell.service.core",
    "ServiceConfig": "sandcell.service.core",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module 'sandcell.service' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
