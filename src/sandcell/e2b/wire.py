"""The E2B request bodies (pydantic, at the edge) and the JSON shapes of a sandbox."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from sandcell.backends.cell.state import SandboxMetrics
from sandcell.e2b.errors import E2BError
from sandcell.e2b.registry import MAX_TIMEOUT_S, E2BSandbox
from sandcell.sessions.saving import MAX_FORKS
from sandcell.spec import MiB

__all__ = [
    "CLIENT_ID",
    "ENVD_VERSION",
    "ENV_NAME",
    "ConnectBody",
    "ContextBody",
    "ExecuteBody",
    "ForkBody",
    "NewSandbox",
    "PauseBody",
    "RefreshBody",
    "SnapshotBody",
    "TimeoutBody",
    "detail_json",
    "iso",
    "metric_json",
    "parse",
    "sandbox_detail",
    "sandbox_json",
]

ENVD_VERSION = "0.6.4"
"""The envd version reported: the SDKs then use every feature served here (octet-stream
uploads, metadata, no default user)."""
CLIENT_ID = "sandcell"
M = TypeVar("M", bound=BaseModel)
DEFAULT_TIMEOUT_S = 300


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]
"""An environment variable's name: what a shell and os.environ both accept."""


class _Body(BaseModel):
    # Unknown fields are ignored as the E2B API does; what is not served is listed in docs/e2b.md.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AutoResume(_Body):
    enabled: bool = False


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=200)
    metadata: dict[str, str] | None = None
    env_vars: dict[EnvName, str] | None = Field(default=None, alias="envVars")
    timeout: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=MAX_TIMEOUT_S)
    auto_pause: bool = Field(default=False, alias="autoPause")
    """``lifecycle={"on_timeout": "pause"}``: the timeout pauses the sandbox."""
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    """``on_timeout`` ``mode``: ``full`` (True) or ``filesystem`` (False); None: the best the
    rung offers."""
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")


class ConnectBody(_Body):
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT_S)
    memory: bool | None = None
    """``on_resume="reboot"`` sends False: come back without the saved memory."""


class PauseBody(_Body):
    memory: bool | None = None
    """``mode="full"`` (True) or ``"filesystem"`` (False); None: the best the rung offers."""


class SnapshotBody(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    memory: bool | None = None


class ForkBody(_Body):
    timeout: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=MAX_TIMEOUT_S)
    count: int = Field(default=1, ge=1, le=MAX_FORKS)


class TimeoutBody(_Body):
    timeout: int = Field(ge=0, le=MAX_TIMEOUT_S)


class RefreshBody(_Body):
    duration: int = Field(default=60, ge=0, le=MAX_TIMEOUT_S)


class ExecuteBody(_Body):
    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[EnvName, str] | None = None


class ContextBody(_Body):
    language: str | None = None
    cwd: str | None = None


def parse(model: type[M], raw: bytes) -> M:
    """The body as ``model``, or a 400 naming the first field that is wrong."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise E2BError(400, f"{where}: {first.get('msg', 'invalid')}") from None


def iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def sandbox_json(box: E2BSandbox) -> dict[str, Any]:
    return {
        "templateID": box.template,
        "sandboxID": box.id,
        "alias": box.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": box.token,
        # Sent back on every interpreter call, so that those carry the sandbox's secret too.
        "trafficAccessToken": box.token,
        "domain": None,
    }


def sandbox_detail(
    *,
    template: str,
    sandbox_id: str,
    started_at: dt.datetime,
    end_at: dt.datetime,
    memory_bytes: int,
    disk_bytes: int,
    metadata: Mapping[str, str],
    auto_pause: str,
    token: str | None = None,
    pause_mode: str | None = None,
) -> dict[str, Any]:
    """E2B's SandboxDetail: a running sandbox's with its ``token``, a paused one's with its
    ``pause_mode`` (``full`` or ``filesystem``)."""
    detail: dict[str, Any] = {
        "templateID": template,
        "sandboxID": sandbox_id,
        "alias": template,
        "clientID": CLIENT_ID,
        "startedAt": iso(started_at),
        "endAt": iso(end_at),
        "envdVersion": ENVD_VERSION,
    }
    if token is not None:
        detail["envdAccessToken"] = token
    detail |= {
        "cpuCount": 1,
        "memoryMB": memory_bytes // MiB,
        "diskSizeMB": disk_bytes // MiB,
        "metadata": dict(metadata),
        "state": "running" if pause_mode is None else "paused",
    }
    if pause_mode is not None:
        detail["pauseMode"] = pause_mode
    detail["lifecycle"] = {
        "onTimeout": "kill" if auto_pause == "off" else "pause",
        "autoResume": False,
    }
    detail["domain"] = None
    return detail


def detail_json(box: E2BSandbox) -> dict[str, Any]:
    limits = box.session.request.effective_limits
    return sandbox_detail(
        template=box.template,
        sandbox_id=box.id,
        started_at=box.started_at,
        end_at=box.end_at(),
        memory_bytes=limits.memory_bytes,
        disk_bytes=limits.workspace_bytes,
        metadata=box.metadata,
        auto_pause=box.auto_pause,
        token=box.token,
    )


def metric_json(m: SandboxMetrics) -> dict[str, Any]:
    """One sample as E2B's SandboxMetric (sandcell keeps no page cache figure: ``memCache`` 0)."""
    when = dt.datetime.fromisoformat(m.timestamp)
    return {
        "timestamp": iso(when),
        "timestampUnix": int(when.timestamp()),
        "cpuCount": m.cpu_count,
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.mem_used_bytes,
        "memTotal": m.mem_total_bytes,
        "memCache": 0,
        "diskUsed": m.disk_used_bytes,
        "diskTotal": m.disk_total_bytes,
    }
