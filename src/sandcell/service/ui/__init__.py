"""``/ui``: the approval queue and run records in a browser, on the service's own executor.

Server-rendered pages (Jinja, autoescaped), no script at all, a login form that trades a
tenant's API key for a session cookie, and a CSRF token on every form. See the "Browser" section
of docs/service.md.
"""

from __future__ import annotations

from fastapi import FastAPI

from sandcell.service.core import Service
from sandcell.service.ui.guard import UI_PATH
from sandcell.service.ui.pages import create_ui

__all__ = ["UI_PATH", "create_ui", "mount_ui"]


def mount_ui(app: FastAPI, service: Service) -> None:
    """Serve the pages of ``service`` under ``/ui`` of ``app``."""
    app.mount(UI_PATH, create_ui(service))
