"""What each page shows, as plain data: built from a ticket or a run record, rendered by the
templates. Nothing here is HTML; every value is text the templates escape.

A run record is JSON the executor wrote from what a hostile program produced, so every field is
read defensively: a field of an unexpected type is shown as absent, never trusted to be a list
or a mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath

from sandcell.policy.approvals import Ticket
from sandcell.policy.tool_tickets import ToolTicket
from sandcell.service.ui.render import size
from sandcell.spec import Limits

__all__ = [
    "ApprovalView",
    "ArtifactView",
    "FindingView",
    "OutputView",
    "RunView",
    "ToolTicketView",
    "approval_view",
    "artifacts_of",
    "code_lines",
    "run_view",
    "tool_ticket_view",
]

IMAGE_TYPES = ("image/png", "image/svg+xml")
"""Figures shown inline (``<img>``): the display collector accepts only these, and checks them."""
STDIN_PREVIEW_CHARS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingView:
    rule_id: str
    severity: str
    line: str
    column: str
    message: str
    snippet: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalView:
    """A run waiting for (or past) a person's decision."""

    id: str
    status: str
    created_at: str
    language: str
    profile: str
    profile_source: str
    profile_sha256: str
    backend: str
    why: str
    findings: tuple[FindingView, ...]
    code: tuple[str, ...]
    code_sha256: str
    inputs: tuple[tuple[str, str], ...]
    """(name, size) of each input file the run will see under /inputs."""
    exports: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    stdin_bytes: int
    stdin_preview: str
    limits: tuple[tuple[str, str], ...]
    declared: bool
    """Whether the caller declared a result (schema, invariants, result file) to validate."""
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    run_id: str | None
    intact: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolTicketView:
    """A governed tool call a run is waiting on."""

    id: str
    status: str
    created_at: str
    expires_at: str
    profile: str
    tool: str
    run_id: str | None
    request_line: str | None
    """``METHOD /path?query`` of an HTTP call, never redacted (shown above the arguments)."""
    args_preview: str
    """The complete arguments, secret-shaped values redacted (shown scrollable, never cut)."""
    args_sha256: str
    args_bytes: int
    intact: bool
    decided_by: str | None
    decided_at: str | None
    reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactView:
    path: str
    name: str
    """The last part of the path: the download's file name."""
    sha256: str
    size: object
    media_type: str
    image: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputView:
    kind: str
    text: str
    """The output's plain text; its ``text/html`` form is the program's markup and never shown."""
    image: ArtifactView | None
    """The figure to show inline: its PNG where there is one, else its SVG."""
    other_forms: tuple[ArtifactView, ...]
    """The figure's other files (the SVG beside the PNG), offered as downloads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """A run's record, read for a person."""

    run_id: str
    outcome: str
    reason: str
    exit_code: object
    signal: object
    started_at: str
    finished_at: str
    language: str
    session_id: str | None
    usage: tuple[tuple[str, str], ...]
    code: tuple[str, ...]
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    outputs: tuple[OutputView, ...]
    artifacts: tuple[ArtifactView, ...]
    rejected: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str, str], ...]
    """(name, size, sha256) of each input the run saw."""
    profile: str
    verdict: str
    policy_reason: str
    findings: tuple[FindingView, ...]
    approval: tuple[tuple[str, str], ...]
    validation: object
    leaks: tuple[Mapping[str, object], ...]
    backend: str
    isolation_mode: str
    layers: tuple[tuple[str, str], ...]
    weakened: tuple[str, ...]
    connections: tuple[Mapping[str, object], ...]
    network: Mapping[str, object] | None
    refused_dropped: int = 0
    """Refused attempts the record counts past the proxy's cap but does not list."""
    tool_calls: tuple[Mapping[str, object], ...]
    tools: Mapping[str, object] | None
    seq: int | None
    hash: str | None
    prev_hash: str | None


def _text(value: object, default: str = "") -> str:
    return default if value is None else str(value)


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _refused_dropped(network: object) -> int:
    # ``unrecorded``: records written before allowed attempts were always kept.
    for key in ("refused_dropped", "unrecorded"):
        value = _map(network).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> Sequence[object]:
    return value if isinstance(value, list | tuple) else ()


def _maps(value: object) -> tuple[Mapping[str, object], ...]:
    return tuple(v for v in _seq(value) if isinstance(v, Mapping))


def code_lines(code: str) -> tuple[str, ...]:
    """The lines of a program as numbered on the page: split on ``\\n`` only, so a ``\\r``
    stays on its line (shown as an escape) instead of shifting the numbers."""
    body = code[:-1] if code.endswith("\n") else code
    return tuple(body.split("\n"))


def _finding(f: Mapping[str, object]) -> FindingView:
    return FindingView(
        rule_id=_text(f.get("rule_id"), "?"),
        severity=_text(f.get("severity"), "?"),
        line=_text(f.get("line"), "?"),
        column=_text(f.get("column"), "?"),
        message=_text(f.get("message")),
        snippet=_text(f.get("snippet")),
    )


def _input_size(path: Path) -> str:
    try:
        return size(path.stat().st_size)
    except OSError:
        return "missing"


def approval_view(ticket: Ticket) -> ApprovalView:
    req, profile = ticket.request, ticket.profile
    limits = req.effective_limits
    preview = req.stdin[:STDIN_PREVIEW_CHARS].decode("utf-8", errors="replace")
    return ApprovalView(
        id=ticket.id,
        status=ticket.status,
        created_at=ticket.created_at,
        language=req.language,
        profile=_text(profile.get("name"), "?"),
        profile_source=_text(profile.get("source"), "?"),
        profile_sha256=_text(profile.get("sha256"), "?"),
        backend=_text(profile.get("backend"), "the profile's default when approved"),
        why=ticket.reason_for_approval,
        findings=tuple(_finding(f) for f in ticket.findings),
        code=code_lines(req.code),
        code_sha256=ticket.code_sha256,
        inputs=tuple((i.name, _input_size(i.host_path)) for i in req.inputs),
        exports=req.exports,
        env=tuple(sorted(req.env.items())),
        stdin_bytes=len(req.stdin),
        stdin_preview=preview,
        limits=tuple((f.name, str(getattr(limits, f.name))) for f in fields(Limits)),
        declared=bool(ticket.declared),
        decided_by=ticket.decided_by,
        decided_at=ticket.decided_at,
        decision_reason=ticket.decision_reason,
        run_id=ticket.run_id,
        intact=ticket.intact,
    )


def tool_ticket_view(ticket: ToolTicket) -> ToolTicketView:
    return ToolTicketView(
        id=ticket.id,
        status=ticket.status,
        created_at=ticket.created_at,
        expires_at=ticket.expires_at,
        profile=ticket.profile,
        tool=ticket.tool,
        run_id=ticket.run_id,
        request_line=ticket.request_line,
        args_preview=ticket.args_preview,
        args_sha256=ticket.args_sha256,
        args_bytes=ticket.args_bytes,
        intact=ticket.intact,
        decided_by=ticket.decided_by,
        decided_at=ticket.decided_at,
        reason=ticket.reason,
    )


def _artifact(a: Mapping[str, object]) -> ArtifactView | None:
    sha = a.get("sha256")
    if not isinstance(sha, str) or not sha:
        return None
    path = _text(a.get("path"), sha)
    media = _text(a.get("media_type"), "application/octet-stream")
    return ArtifactView(
        path=path,
        name=PurePosixPath(path).name or sha,
        sha256=sha,
        size=a.get("size"),
        media_type=media,
        image=media in IMAGE_TYPES,
    )


def _artifacts(value: object) -> tuple[ArtifactView, ...]:
    found = (_artifact(a) for a in _maps(value))
    return tuple(a for a in found if a is not None)


def _output(o: Mapping[str, object]) -> OutputView:
    data = _map(o.get("data"))
    text = data.get("text/plain")
    if not isinstance(text, str):
        text = _text(data.get("application/json"))
    files = _artifacts(o.get("artifacts"))
    images = sorted((a for a in files if a.image), key=lambda a: a.media_type != "image/png")
    shown = images[0] if images else None
    return OutputView(
        kind=_text(o.get("kind"), "?"),
        text=text,
        image=shown,
        other_forms=tuple(a for a in files if a is not shown),
    )


def _usage(usage: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    out = []
    for key, label, unit in (
        ("wall_ms", "wall time", "ms"),
        ("cpu_ms", "CPU time", "ms"),
        ("peak_memory_bytes", "peak memory", "bytes"),
    ):
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append((label, f"{value:.1f} ms" if unit == "ms" else f"{value} bytes"))
    return tuple(out)


def artifacts_of(record: Mapping[str, object]) -> tuple[ArtifactView, ...]:
    """Every artifact a record names: its exports, then the figures of its outputs."""
    found = list(_artifacts(record.get("artifacts")))
    for o in _maps(record.get("outputs")):
        found += _artifacts(o.get("artifacts"))
    return tuple(found)


def run_view(
    record: Mapping[str, object],
    *,
    seq: int | None = None,
    hash_: str | None = None,
    prev_hash: str | None = None,
) -> RunView:
    policy = _map(record.get("policy"))
    profile = _map(policy.get("profile"))
    enforcement = _map(record.get("enforcement"))
    network = record.get("network")
    tools = record.get("tools")
    inputs = tuple(
        (_text(i.get("name"), "?"), _text(i.get("size"), "?"), _text(i.get("sha256"), "?"))
        for i in _maps(record.get("inputs"))
    )
    return RunView(
        run_id=_text(record.get("run_id"), "?"),
        outcome=_text(record.get("outcome"), "?"),
        reason=_text(record.get("reason")),
        exit_code=record.get("exit_code"),
        signal=record.get("signal"),
        started_at=_text(record.get("started_at")),
        finished_at=_text(record.get("finished_at")),
        language=_text(record.get("language"), "?"),
        session_id=_optional_text(record.get("session_id")),
        usage=_usage(_map(record.get("usage"))),
        code=code_lines(_text(record.get("code"))),
        stdout=_text(record.get("stdout")),
        stderr=_text(record.get("stderr")),
        stdout_truncated=record.get("stdout_truncated") is True,
        stderr_truncated=record.get("stderr_truncated") is True,
        outputs=tuple(_output(o) for o in _maps(record.get("outputs"))),
        artifacts=_artifacts(record.get("artifacts")),
        rejected=tuple(
            (_text(r.get("path"), "?"), _text(r.get("reason")))
            for r in _maps(record.get("rejected_exports"))
        ),
        inputs=inputs,
        profile=_text(profile.get("name"), "?"),
        verdict=_text(policy.get("verdict"), "none recorded"),
        policy_reason=_text(policy.get("reason")),
        findings=tuple(_finding(f) for f in _maps(policy.get("findings"))),
        approval=tuple((str(k), _text(v, "-")) for k, v in _map(policy.get("approval")).items()),
        validation=record.get("validation"),
        leaks=_maps(record.get("leaks")),
        backend=_text(enforcement.get("backend"), _text(_map(record.get("backend")).get("name"))),
        isolation_mode=_text(enforcement.get("mode"), _text(record.get("mode"))),
        layers=tuple((str(k), _text(v)) for k, v in _map(enforcement.get("layers")).items()),
        weakened=tuple(_text(w) for w in _seq(enforcement.get("weakened"))),
        connections=_maps(_map(network).get("connections")),
        network=network if isinstance(network, Mapping) else None,
        refused_dropped=_refused_dropped(network),
        tool_calls=_maps(_map(tools).get("calls")),
        tools=tools if isinstance(tools, Mapping) else None,
        seq=seq,
        hash=hash_,
        prev_hash=prev_hash,
    )
