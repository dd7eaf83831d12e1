"""What goes over the wire, as pure data: where the service is, the request bodies built from
the executor's own arguments, and the executor's types rebuilt from the answers. The sync and
async clients share all of it and do only the I/O."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.audit import AuditEntry
from sandcell.errors import ConfigError
from sandcell.spec import (
    InputFile,
    IsolationMode,
    Language,
    Limits,
    RejectedExport,
    RunRequest,
    RunResult,
    language_named,
    result_from_dict,
)

if TYPE_CHECKING:
    from sandcell.backends.cell.state import SandboxMetrics
    from sandcell.sessions.session import SessionEnd, SessionInfo

__all__ = [
    "Approval",
    "Endpoint",
    "SavedSession",
    "approval_from_dict",
    "endpoint_from_env",
    "files_body",
    "metrics_from_dict",
    "run_body",
    "saved_from_dict",
    "session_body",
    "session_end_from_dict",
    "session_info_from_dict",
    "status_result",
]

SOCKET_NAME = "service.sock"
_SOCKET_BASE = "http://localhost"
"""The base URL of requests over the Unix socket (a loopback Host name, which the service's
``/mcp`` also accepts)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the service answers: a base URL, or a Unix socket (``socket``) and the base URL
    its requests name."""

    base_url: str
    api_key: str | None
    socket: Path | None = None

    def describe(self) -> str:
        return f"unix:{self.socket}" if self.socket is not None else self.base_url


def endpoint_from_env(
    environ: Mapping[str, str] | None = None, *, home: Path | None = None
) -> Endpoint:
    """``$SANDCELL_URL`` with ``$SANDCELL_API_KEY``; else the service's local socket in the
    sandcell home (``$SANDCELL_HOME``), with ``$SANDCELL_API_KEY`` if set."""
    env = os.environ if environ is None else environ
    key = env.get("SANDCELL_API_KEY") or None
    url = env.get("SANDCELL_URL")
    if url:
        if key is None:
            raise ConfigError(
                f"$SANDCELL_URL is {url!r} but $SANDCELL_API_KEY is not set; set it to the "
                "tenant's key (`sandcell tenants add` prints one)"
            )
        return Endpoint(url.rstrip("/"), key)
    if home is None:
        from sandcell.home import data_dir

        found = env.get("SANDCELL_HOME")
        home = Path(found).expanduser() if found else data_dir()
    sock = home / SOCKET_NAME
    if sock.is_socket():
        return Endpoint(_SOCKET_BASE, key, sock)
    raise ConfigError(
        f"no sandcell service to talk to: $SANDCELL_URL is not set and there is no local "
        f"socket at {sock}; start one with `sandcell serve`, or set SANDCELL_URL and "
        "SANDCELL_API_KEY"
    )


# -- request bodies --------------------------------------------------------------------------


def as_request(request: RunRequest | str, language: Language | str) -> RunRequest:
    """The request for the code alone in ``language``, by any name it goes by (``js``, ``ts``:
    an unknown name is a ConfigError before anything is sent)."""
    if isinstance(request, RunRequest):
        return request
    return RunRequest(code=request, language=language_named(language))


def files_body(inputs: Sequence[InputFile]) -> dict[str, str]:
    """Input files as the service takes them: name -> base64 of the bytes (read here, so the
    paths are this machine's, as in-process)."""
    out: dict[str, str] = {}
    for item in inputs:
        path = Path(item.host_path)
        if not path.is_file():
            raise ConfigError(
                f"input {item.name!r}: {path} is not a file; the service takes files only "
                "(archive a directory, or send its files one by one)"
            )
        out[item.name] = base64.b64encode(path.read_bytes()).decode("ascii")
    return out


def _check_profile(profile: object) -> None:
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(
            "over the service a profile is named (profile='analysis'): the service loads its "
            "own, and the record names the content it ran under"
        )


def _limits(limits: Limits | None) -> dict[str, object] | None:
    return None if limits is None else asdict(limits)


def run_body(
    request: RunRequest,
    *,
    profile: str | None,
    backend: str | None,
    schema: Mapping[str, object] | None,
    model: object,
    invariants: Sequence[object],
    result_file: str | None,
    approve: object,
    wait: bool,
) -> dict[str, Any]:
    """The ``POST /v1/runs`` body for what ``Executor.run`` would be given; what only works
    in-process is refused with the reason, never dropped."""
    _check_profile(profile)
    if model is not None:
        raise ConfigError(
            "model= validates with a Python class, in-process only; over the service pass "
            "schema=Model.model_json_schema() (the value comes back as JSON)"
        )
    if approve is not None:
        raise ConfigError(
            "approve= is a callback in this process; over the service a run that needs "
            "approval comes back awaiting_approval: decide it with client.approve(id) or "
            "client.deny(id, reason)"
        )
    for inv in invariants:
        if not isinstance(inv, str):
            raise ConfigError(
                "over the service invariants are expressions (strings); a Python callable "
                "runs in-process only"
            )
    if request.packages:
        raise ConfigError("packages are host directories: the service cannot see them")
    if request.mode is not IsolationMode.STRICT or request.landlock is not None:
        raise ConfigError(
            "the service runs every run in strict mode with its own Landlock setting; leave "
            "mode and landlock at their defaults"
        )
    try:
        stdin = request.stdin.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            "stdin: the service takes text; send binary data as an input file"
        ) from None
    body: dict[str, Any] = {
        "code": request.code,
        "language": request.language,
        "profile": profile,
        "backend": backend,
        "stdin": stdin,
        "env": dict(request.env),
        "exports": list(request.exports),
        "limits": _limits(request.limits),
        "display": request.display,
        **({"runtime": request.runtime} if request.runtime is not None else {}),
        "schema": None if schema is None else dict(schema),
        "invariants": [str(i) for i in invariants],
        "result_file": result_file,
        "files": files_body(request.inputs),
        "wait": wait,
    }
    return body


def session_body(
    *,
    profile: str | None,
    limits: Limits | None,
    inputs: Sequence[InputFile],
    mode: IsolationMode,
    landlock: bool | None,
    idle_timeout_s: float | None,
    max_lifetime_s: float | None,
    on_idle: str = "end",
    paused_ttl_s: float | None = None,
    snapshot: str | None = None,
    language: str = "python",
) -> dict[str, Any]:
    _check_profile(profile)
    language = language_named(language)
    if mode is not IsolationMode.STRICT or landlock is not None:
        raise ConfigError(
            "the service runs sessions in strict mode with its own Landlock setting; leave "
            "mode and landlock at their defaults"
        )
    return {
        "profile": profile,
        "limits": _limits(limits),
        "idle_timeout_s": idle_timeout_s,
        "max_lifetime_s": max_lifetime_s,
        "files": files_body(inputs),
        "on_idle": on_idle,
        "paused_ttl_s": paused_ttl_s,
        "snapshot": snapshot,
        # Sent only when it is not the default, which a service without languages takes too.
        **({"language": language} if language != "python" else {}),
    }


# -- answers ----------------------------------------------------------------------------------


def status_result(data: object) -> RunResult:
    """The result of a run status body (``{id, status, result}``) that has finished."""
    if not isinstance(data, Mapping) or not isinstance(data.get("result"), Mapping):
        raise ConfigError(f"the service answered a run status without a result: {data!r:.200}")
    return result_from_dict(data["result"])


def session_info_from_dict(data: Mapping[str, Any]) -> SessionInfo:
    from sandcell.sessions.session import SessionInfo

    return SessionInfo(
        id=str(data["id"]),
        profile=str(data["profile"]),
        backend=str(data["backend"]),
        created_at=str(data["created_at"]),
        cells=int(data["cells"]),
        idle_timeout_s=float(data["idle_timeout_s"]),
        max_lifetime_s=float(data["max_lifetime_s"]),
        ended=None if data.get("ended") is None else str(data["ended"]),
        on_idle=str(data.get("on_idle") or "end"),
        parent=None if data.get("parent") is None else str(data["parent"]),
        language=str(data.get("language") or "python"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedSession:
    """A paused session or a snapshot on the service, as it lists them (what
    :meth:`StoredState.summary <sandcell.sessions.states.StoredState.summary>` says of one
    in-process; the service keeps its files)."""

    id: str
    kind: str
    """``paused`` or ``snapshot``."""
    name: str | None
    session_id: str
    profile: str
    backend: str
    mode: str
    """``memory`` or ``files``."""
    created_at: str
    expires_at: str | None
    cells: int
    stored_bytes: int
    sha256: str

    def summary(self) -> dict[str, object]:
        return asdict(self)


def saved_from_dict(data: Mapping[str, Any]) -> SavedSession:
    return SavedSession(
        id=str(data["id"]),
        kind=str(data["kind"]),
        name=None if data.get("name") is None else str(data["name"]),
        session_id=str(data["session_id"]),
        profile=str(data["profile"]),
        backend=str(data["backend"]),
        mode=str(data["mode"]),
        created_at=str(data["created_at"]),
        expires_at=None if data.get("expires_at") is None else str(data["expires_at"]),
        cells=int(data["cells"]),
        stored_bytes=int(data["stored_bytes"]),
        sha256=str(data["sha256"]),
    )


def metrics_from_dict(data: Mapping[str, Any]) -> SandboxMetrics:
    from sandcell.backends.cell.state import SandboxMetrics

    return SandboxMetrics(
        timestamp=str(data["timestamp"]),
        cpu_count=int(data["cpu_count"]),
        cpu_used_pct=float(data["cpu_used_pct"]),
        mem_used_bytes=int(data["mem_used_bytes"]),
        mem_total_bytes=int(data["mem_total_bytes"]),
        disk_used_bytes=int(data["disk_used_bytes"]),
        disk_total_bytes=int(data["disk_total_bytes"]),
    )


def session_end_from_dict(data: Mapping[str, Any]) -> SessionEnd:
    from sandcell.sessions.session import SessionEnd

    shell = result_from_dict(
        {"run_id": "", "outcome": "ok", "exit_code": None, "signal": None, **data}
    )
    return SessionEnd(
        artifacts=shell.artifacts,
        rejected_exports=tuple(
            RejectedExport(path=r.path, reason=r.reason) for r in shell.rejected_exports
        ),
        reason=str(data.get("reason", "")),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """A run waiting for a person's approval (or decided), as the service shows it."""

    id: str
    created_at: str
    status: str
    """``pending``, ``approved``, ``denied`` or ``ran``."""
    code: str
    language: str
    profile: Mapping[str, object]
    findings: tuple[Mapping[str, object], ...]
    reason_for_approval: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    run_id: str | None
    intact: bool
    """The stored request still hashes to what was submitted."""


def approval_from_dict(data: Mapping[str, Any]) -> Approval:
    return Approval(
        id=str(data["id"]),
        created_at=str(data["created_at"]),
        status=str(data["status"]),
        code=str(data["code"]),
        language=str(data["language"]),
        profile=dict(data.get("profile") or {}),
        findings=tuple(dict(f) for f in data.get("findings") or ()),
        reason_for_approval=str(data.get("reason_for_approval", "")),
        decided_by=data.get("decided_by"),
        decided_at=data.get("decided_at"),
        decision_reason=data.get("decision_reason"),
        run_id=data.get("run_id"),
        intact=bool(data.get("intact", False)),
    )


def audit_entry_from_dict(data: Mapping[str, Any]) -> AuditEntry:
    """The :class:`~sandcell.audit.AuditEntry` of ``GET /v1/audit/{id}``."""
    record = dict(data["record"])
    return AuditEntry(
        seq=int(data["seq"]),
        run_id=str(record.get("run_id", "")),
        # The body names no append time; the record's own end time is set just before it.
        created_at=str(data.get("created_at") or record.get("finished_at") or ""),
        record=record,
        prev_hash=str(data["prev_hash"]),
        hash=str(data["hash"]),
    )
