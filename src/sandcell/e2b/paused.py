"""Paused E2B sandboxes: the paused states under the home whose labels say which sandbox they
were (:mod:`sandcell.e2b.labels`), found by the tenant that owns them.

They are read from the home on every call, never held in memory, so a paused sandbox outlives
the service process: after a restart it is listed, described and resumed as before.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandcell.backends.cell.state import PauseMode
from sandcell.e2b.labels import SandboxLabels
from sandcell.e2b.wire import sandbox_detail
from sandcell.errors import ConfigError
from sandcell.service.core import Service
from sandcell.sessions.states import StoredState

__all__ = ["PausedSandbox", "paused_detail_json", "paused_of", "paused_of_tenant"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PausedSandbox:
    """One paused sandbox of a tenant."""

    stored: StoredState
    labels: SandboxLabels

    @property
    def id(self) -> str:
        return self.stored.session_id

    @property
    def template(self) -> str:
        return self.labels.template

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.labels.metadata

    @property
    def started_at(self) -> dt.datetime:
        return self.labels.started_at

    @property
    def state(self) -> str:
        return "paused"

    @property
    def mode(self) -> PauseMode:
        return self.stored.saved.mode

    @classmethod
    def of(cls, stored: StoredState) -> PausedSandbox | None:
        labels = SandboxLabels.of(stored.labels)
        if stored.kind != "paused" or labels is None:
            return None
        return cls(stored=stored, labels=labels)


def paused_of(service: Service, tenant: str, sandbox_id: str) -> PausedSandbox | None:
    """The tenant's paused sandbox ``sandbox_id``, or None (none, another tenant's, expired)."""
    with contextlib.suppress(ConfigError):
        return PausedSandbox.of(service.executor.states.get(sandbox_id, owner=tenant))
    return None


def paused_of_tenant(service: Service, tenant: str) -> list[PausedSandbox]:
    found = (PausedSandbox.of(s) for s in service.executor.paused(owner=tenant))
    return [p for p in found if p is not None]


def paused_detail_json(paused: PausedSandbox) -> dict[str, Any]:
    """E2B's SandboxDetail of a paused sandbox (``endAt``: when it was paused)."""
    limits = paused.stored.settings.limits
    return sandbox_detail(
        template=paused.template,
        sandbox_id=paused.id,
        started_at=paused.started_at,
        end_at=dt.datetime.fromisoformat(paused.stored.created_at),
        memory_bytes=int(limits.get("memory_bytes", 0)),
        disk_bytes=int(limits.get("workspace_bytes", 0)),
        metadata=paused.metadata,
        auto_pause=paused.labels.auto_pause,
        pause_mode="full" if paused.mode is PauseMode.MEMORY else "filesystem",
    )
