"""The service's request and response bodies: pydantic at the edge, nothing else here.

Every request model forbids unknown fields, so a misspelt option is a 422 naming the field
rather than an option silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from sandcell.spec import LANGUAGE_ALIASES, LANGUAGES, Language

RunStatusName = Literal["queued", "running", "finished"]


def _full_name(value: object) -> object:
    """A language's full name for any name it goes by (``js`` is javascript); anything else is
    left for the Literal to refuse with a 422 that lists the names."""
    if isinstance(value, str):
        return LANGUAGE_ALIASES.get(value.strip().lower(), value)
    return value


LanguageName = Annotated[
    Language,
    BeforeValidator(_full_name),
    Field(description=f"{', '.join(LANGUAGES)} (or js, ts, sh)"),
]
"""A program's language as a request names it: the full name or a short one (js, ts, sh)."""

KernelLanguageName = Annotated[
    Literal["python", "javascript", "typescript"],
    BeforeValidator(_full_name),
    Field(
        description="the language of the session's cells: python (bash cells too), javascript "
        "or typescript (or js, ts)"
    ),
]
"""A session's language: the languages a session kernel runs, by any name they go by."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LimitsBody(_Request):
    """Limits asked for; each at most the profile's ceiling (a higher one is a 400)."""

    wall_time_s: float | None = Field(default=None, gt=0)
    cpu_time_s: int | None = Field(default=None, gt=0)
    memory_bytes: int | None = Field(default=None, gt=0)
    max_pids: int | None = Field(default=None, gt=0)
    max_open_files: int | None = Field(default=None, gt=0)
    max_file_bytes: int | None = Field(default=None, gt=0)
    workspace_bytes: int | None = Field(default=None, gt=0)
    workspace_inodes: int | None = Field(default=None, gt=0)
    tmp_bytes: int | None = Field(default=None, gt=0)
    stdout_bytes: int | None = Field(default=None, gt=0)
    stderr_bytes: int | None = Field(default=None, gt=0)


class RunBody(_Request):
    """One program to run in a fresh sandbox."""

    code: str
    language: LanguageName = "python"
    profile: str | None = Field(
        default=None, description="one of the tenant's profiles (default: its first)"
    )
    backend: str | None = Field(
        default=None,
        description="the rung the run must get (namespaces, gvisor, microvm); a run the service "
        "would put elsewhere is refused, never moved",
    )
    stdin: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    exports: list[str] = Field(default_factory=list)
    limits: LimitsBody | None = None
    display: bool = False
    runtime: str | None = Field(
        default=None,
        description="the runtime to run in (sandcell runtime list; default: the profile's)",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
    )
    result_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    invariants: list[str] = Field(default_factory=list)
    result_file: str | None = None
    files: dict[str, str] = Field(
        default_factory=dict,
        description="input files, name → base64 content, shown read-only under /inputs",
    )
    wait: bool = Field(
        default=True,
        description="true: answer with the result; false: answer 202 at once with the run's id",
    )


class RuntimeRefBody(BaseModel):
    """The built runtime a run used, as its record names it."""

    name: str = Field(description="the runtime asked for (sandcell runtime list)")
    tree_sha256: str = Field(description="the content hash of the tree it ran in")
    lock_sha256: str = Field(description="the hash of the lock that tree was built from")


class ResultBody(BaseModel):
    """A run's result, as ``sandcell run --json`` prints it."""

    run_id: str
    outcome: str
    reason: str
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    usage: dict[str, Any]
    artifacts: list[dict[str, Any]]
    rejected_exports: list[dict[str, Any]]
    enforcement: dict[str, Any] | None
    started_at: str
    policy: dict[str, Any] | None
    validation: dict[str, Any] | None
    leaks: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    start: dict[str, Any]
    session_id: str | None
    network: dict[str, Any] | None
    tools: dict[str, Any] | None
    runtime: RuntimeRefBody | None = Field(
        default=None,
        description="the built runtime the run used; null: sandcell's own environment",
    )


class RunStatusBody(BaseModel):
    """Where a run stands; ``result`` once it has finished."""

    id: str
    status: RunStatusName
    cancel_requested: bool = False
    result: ResultBody | None = None
    record_only: bool = Field(
        default=False,
        description="true when the run finished before the service last started: the fields "
        "come from its run record",
    )


class CancelBody(BaseModel):
    id: str
    status: RunStatusName
    cancel_requested: bool


class SessionBody(_Request):
    profile: str | None = None
    language: KernelLanguageName = "python"
    runtime: str | None = Field(
        default=None,
        description="the runtime to run in (sandcell runtime list; default: the profile's)",
        pattern=r"^[a-z][a-z0-9_-]{0,39}$",
    )
    limits: LimitsBody | None = None
    idle_timeout_s: float | None = Field(default=None, gt=0)
    max_lifetime_s: float | None = Field(default=None, gt=0)
    files: dict[str, str] = Field(
        default_factory=dict, description="input files, name → base64 content"
    )
    on_idle: Literal["end", "pause"] = Field(
        default="end",
        description="what the idle timeout (or the lifetime) does: end the session, or pause "
        "it (GET /v1/paused lists it, POST /v1/sessions/{id}/resume brings it back)",
    )
    paused_ttl_s: float | None = Field(
        default=None, gt=0, description="how long a paused state of it is kept (default 30 days)"
    )
    snapshot: str | None = Field(
        default=None,
        description="start from this snapshot of the tenant's (POST /v1/sessions/{id}/snapshots):"
        " its profile, limits, inputs and state are the snapshot's, so give nothing else but "
        "profile (naming the snapshot's, if at all)",
    )


class SessionInfoBody(BaseModel):
    id: str
    profile: str
    language: str = Field(default="python", description="the language of its cells")
    backend: str
    created_at: str
    cells: int
    idle_timeout_s: float
    max_lifetime_s: float
    ended: str | None
    on_idle: Literal["end", "pause"] = "end"
    parent: str | None = Field(
        default=None, description="the session it was forked or started (from a snapshot) from"
    )


PauseModeName = Literal["memory", "files"]
_MODE = (
    "memory: variables, processes and files (gVisor and microVM); files: the workspace's "
    "files only, the interpreter starts empty (every rung)"
)


class PauseBody(_Request):
    mode: PauseModeName = Field(default="memory", description=_MODE)


class SnapshotBody(_Request):
    name: str = Field(
        description="1 to 64 letters, digits, '.', '_' or '-'; a snapshot of that name is replaced",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
    )
    mode: PauseModeName = Field(default="memory", description=_MODE)
    ttl_s: float | None = Field(
        default=None, gt=0, description="removed after this many seconds (null: until deleted)"
    )


class ForkBody(_Request):
    n: int = Field(default=1, ge=1, le=20, description="how many copies (1 to 20)")
    mode: PauseModeName = Field(default="memory", description=_MODE)


class StateBody(BaseModel):
    """A saved session state: a paused session or a snapshot (no host paths)."""

    id: str = Field(description="a paused session's: the session's id")
    kind: Literal["paused", "snapshot", "fork"]
    name: str | None = Field(description="a snapshot's name")
    session_id: str = Field(description="the session it was saved from")
    profile: str
    backend: str = Field(description="the rung that saved it; only that rung restores it")
    mode: PauseModeName
    created_at: str
    expires_at: str | None = Field(description="when it is removed (null: kept until deleted)")
    cells: int = Field(description="cells the session had run when it was saved")
    stored_bytes: int = Field(description="disk it holds; counts in max_stored_bytes")
    sha256: str = Field(description="of every file's path, size and hash: its id in records")


class ForkedBody(BaseModel):
    parent: str = Field(description="the session forked (live or paused)")
    sessions: list[SessionInfoBody]


class MetricsBody(BaseModel):
    """One sample of a live session's resources."""

    timestamp: str
    cpu_count: int
    cpu_used_pct: float = Field(description="since the previous sample, of cpu_count CPUs")
    mem_used_bytes: int
    mem_total_bytes: int = Field(description="the session's memory limit")
    disk_used_bytes: int = Field(description="bytes in the workspace")
    disk_total_bytes: int = Field(description="the workspace's size limit")


class CellBody(_Request):
    code: str
    timeout_s: float | None = Field(default=None, gt=0)
    exports: list[str] = Field(default_factory=list)


class CellCancelBody(BaseModel):
    id: str = Field(description="the session's id")
    cell_running: bool = Field(
        description="a cell was running and is being interrupted; its own request answers "
        "with its result (outcome killed, reason 'cancelled: ...')"
    )


class SessionFilesBody(BaseModel):
    files: list[str]


class SessionCloseBody(_Request):
    exports: list[str] = Field(default_factory=list)


class SessionEndBody(BaseModel):
    id: str
    reason: str
    artifacts: list[dict[str, Any]]
    rejected_exports: list[dict[str, Any]]


class ApprovalBody(BaseModel):
    id: str
    created_at: str
    status: str
    code: str
    language: str
    profile: dict[str, Any]
    findings: list[dict[str, Any]]
    reason_for_approval: str
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    run_id: str | None
    intact: bool


class ToolApprovalBody(BaseModel):
    """A governed tool call waiting for a person (a tool ticket, id ``t...``)."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    created_at: str
    expires_at: str = Field(description="after this (UTC) it can no longer be approved")
    status: str = Field(description="pending, approved, denied or expired")
    profile: str = Field(description="the profile whose [tools] asked for approval")
    tool: str = Field(description="tool.operation, as the gateway checked it")
    run_id: str | None = Field(description="the run (or session) that asked")
    request_line: str | None = Field(
        default=None,
        description="METHOD /path?query of an HTTP request, never redacted; null for other tools",
    )
    args_preview: str = Field(
        description="the complete arguments as indented JSON, secret-shaped values redacted; "
        "nothing is cut"
    )
    args_sha256: str = Field(
        description="of the arguments' canonical JSON, as in the record; the call runs only if "
        "the arguments it sends hash to this"
    )
    args_bytes: int
    intact: bool = Field(
        default=True,
        description="false when the stored arguments no longer hash to args_sha256 (edited in "
        "the store): approving such a ticket lets no call through",
    )
    decided_by: str | None
    decided_at: str | None
    reason: str | None = Field(description="the decider's reason, or why it expired")


class DecisionBody(_Request):
    reason: str = ""


class AuditSummaryBody(BaseModel):
    run_id: str
    started_at: str | None
    language: str | None
    outcome: str | None
    wall_ms: float | None
    session_id: str | None


class AuditEntryBody(BaseModel):
    seq: int
    hash: str
    prev_hash: str
    record: dict[str, Any]


class VerifyBody(BaseModel):
    ok: bool = Field(description="the whole chain is intact (every tenant's records)")
    records: int = Field(description="how many records are the caller's")
    problems: list[dict[str, Any]] = Field(description="problems in the caller's records")
    other_problems: int = Field(description="problems in records that are not the caller's")


class ProfileBody(BaseModel):
    name: str
    source: str
    description: str
    approval: str | None
    problem: str | None


class TenantBody(BaseModel):
    name: str
    profiles: list[str]
    max_concurrent: int
    runs_per_minute: int
    cpu_seconds_per_day: int
    max_stored_bytes: int
    created_at: str
    in_flight: int
    cpu_seconds_today: float
    stored_bytes: int


class HealthBody(BaseModel):
    status: Literal["ok", "draining", "database_unreachable", "cluster_unreachable"]
    version: str
    runs_in_flight: int
    sessions: int
    replica: str | None = None
    """This replica's id among those sharing a PostgreSQL database (None: it shares none)."""
    detail: str | None = None
    """Why it is not ok (the database or the Ray cluster it cannot reach)."""


class Problem(BaseModel):
    """An error, as RFC 9457 ``application/problem+json``."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None
