"""Each operation of the client as a plan: the HTTP call, how to read its answer, and what an
error status means for it. :class:`~sandcell.client.Client` and
:class:`~sandcell.client.AsyncClient` carry the plans out, one blocking and one with asyncio."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from sandcell.audit import AuditEntry
from sandcell.backends.cell.state import SandboxMetrics
from sandcell.client.errors import ServiceError
from sandcell.client.wire import (
    Approval,
    SavedSession,
    approval_from_dict,
    audit_entry_from_dict,
    metrics_from_dict,
    saved_from_dict,
    status_result,
)
from sandcell.errors import ConfigError
from sandcell.spec import RunResult, result_from_dict

__all__ = ["Call", "read_events"]

T = TypeVar("T")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise ConfigError(
            f"the service answered something that is not JSON: {body[:200]!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to turn its answer into a ``T``."""

    method: str
    path: str
    read: Callable[[bytes], T]
    body: Mapping[str, Any] | None = None
    content: bytes | None = None
    params: Mapping[str, str | int] = field(default_factory=dict)
    refused: Callable[[ServiceError], T] | None = None
    """What a 4xx problem means here (a value, or a more precise error to raise); None: the
    :class:`ServiceError` itself is raised."""

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"


def _seg(value: str) -> str:
    return quote(value, safe="")


def run(body: Mapping[str, Any]) -> Call[RunResult]:
    return Call("POST", "/v1/runs", lambda b: status_result(_json(b)), body=body)


def submit(body: Mapping[str, Any]) -> Call[str]:
    return Call("POST", "/v1/runs", lambda b: str(_json(b)["id"]), body={**body, "wait": False})


def status(run_id: str) -> Call[Mapping[str, Any]]:
    return Call("GET", f"/v1/runs/{_seg(run_id)}", _json)


def events_path(run_id: str) -> str:
    return f"/v1/runs/{_seg(run_id)}/events"


def cancel(run_id: str) -> Call[bool]:
    def finished(error: ServiceError) -> bool:
        if error.status == 409:  # it has ended: nothing to stop, as Executor.cancel says
            return False
        raise error

    return Call("POST", f"/v1/runs/{_seg(run_id)}/cancel", lambda b: True, refused=finished)


def replay(run_id: str, body: Mapping[str, Any]) -> Call[tuple[RunResult, dict[str, Any]]]:
    def read(b: bytes) -> tuple[RunResult, dict[str, Any]]:
        answer = _json(b)
        return status_result(answer), dict(answer["replay"])

    return Call("POST", f"/v1/runs/{_seg(run_id)}/replay", read, body=body)


def artifact(sha256: str) -> Call[bytes]:
    return Call("GET", f"/v1/artifacts/{_seg(sha256)}", lambda b: b)


def approvals(status: str, limit: int) -> Call[list[Approval]]:
    return Call(
        "GET",
        "/v1/approvals",
        lambda b: [approval_from_dict(a) for a in _json(b)],
        params={"status": status, "limit": limit},
    )


def approval(approval_id: str) -> Call[Approval]:
    return Call("GET", f"/v1/approvals/{_seg(approval_id)}", lambda b: approval_from_dict(_json(b)))


def approve(approval_id: str, reason: str) -> Call[RunResult]:
    return Call(
        "POST",
        f"/v1/approvals/{_seg(approval_id)}/approve",
        lambda b: status_result(_json(b)),
        body={"reason": reason},
    )


def deny(approval_id: str, reason: str) -> Call[RunResult]:
    return Call(
        "POST",
        f"/v1/approvals/{_seg(approval_id)}/deny",
        lambda b: result_from_dict(_json(b)),
        body={"reason": reason},
    )


def audit(run_id: str) -> Call[AuditEntry]:
    return Call("GET", f"/v1/audit/{_seg(run_id)}", lambda b: audit_entry_from_dict(_json(b)))


def profiles() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/profiles", lambda b: [dict(p) for p in _json(b)])


# -- sessions ------------------------------------------------------------------------------------


def _ended(error: ServiceError) -> Any:
    """A session the service no longer has (ended, reaped) is SessionEnded, as in-process."""
    if error.status in (404, 409):
        from sandcell.sessions import SessionEnded

        raise SessionEnded(
            f"{error.detail}; the session has ended (closed, idle or out of lifetime): start "
            "a new one"
        ) from None
    raise error


def session_open(body: Mapping[str, Any]) -> Call[Mapping[str, Any]]:
    return Call("POST", "/v1/sessions", _json, body=body)


def session_info(session_id: str) -> Call[Mapping[str, Any]]:
    return Call("GET", f"/v1/sessions/{_seg(session_id)}", _json, refused=_ended)


def cell(
    session_id: str,
    code: str,
    timeout_s: float | None,
    exports: tuple[str, ...],
    *,
    stream: bool = False,
) -> Call[RunResult]:
    """One cell; with ``stream``, the call whose answer is the cell's event stream (its
    ``read`` is then not used: the stream's ``result`` event is the result)."""
    return Call(
        "POST",
        f"/v1/sessions/{_seg(session_id)}/cells" + ("/stream" if stream else ""),
        lambda b: result_from_dict(_json(b)),
        body={"code": code, "timeout_s": timeout_s, "exports": list(exports)},
        refused=_ended,
    )


def cell_cancel(session_id: str) -> Call[bool]:
    def idle(error: ServiceError) -> bool:
        # 409: no cell is running; 404: the session has ended. Nothing to stop either way,
        # as Session.cancel says in-process.
        if error.status in (404, 409):
            return False
        raise error

    return Call("POST", f"/v1/sessions/{_seg(session_id)}/cancel", lambda b: True, refused=idle)


def session_files(session_id: str) -> Call[list[str]]:
    return Call(
        "GET",
        f"/v1/sessions/{_seg(session_id)}/files",
        lambda b: [str(f) for f in _json(b)["files"]],
        refused=_ended,
    )


def _file_path(session_id: str, path: str) -> str:
    return f"/v1/sessions/{_seg(session_id)}/files/{quote(path.lstrip('/'), safe='/')}"


def read_file(session_id: str, path: str) -> Call[bytes]:
    # No SessionEnded here: a 404 may be a file that is not there.
    return Call("GET", _file_path(session_id, path), lambda b: b)


def write_file(session_id: str, path: str, data: bytes) -> Call[RunResult]:
    return Call(
        "PUT",
        _file_path(session_id, path),
        lambda b: result_from_dict(_json(b)),
        content=data,
        refused=_ended,
    )


def session_close(session_id: str, exports: tuple[str, ...]) -> Call[Mapping[str, Any]]:
    return Call(
        "POST", f"/v1/sessions/{_seg(session_id)}/close", _json, body={"exports": list(exports)}
    )


# -- sessions that last: pause, resume, snapshots, forks ----------------------------------------


def _refused_save(error: ServiceError) -> Any:
    """A save the session's rung cannot do (422 without field errors) is PauseRefused, and a
    session the service no longer has is SessionEnded, as in-process."""
    if error.status == 422 and not error.errors:
        from sandcell.backends.cell.state import PauseRefused

        raise PauseRefused(error.detail) from None
    return _ended(error)


def _state_refused(error: ServiceError) -> Any:
    """A saved state the tenant does not have is StateNotFound; one changed on disk,
    StateTampered, as in-process."""
    from sandcell.sessions.states import StateNotFound, StateTampered

    if error.status == 404:
        raise StateNotFound(error.detail) from None
    if error.status == 409:
        raise StateTampered(error.detail) from None
    raise error


def _saved_list(b: bytes) -> list[SavedSession]:
    return [saved_from_dict(s) for s in _json(b)]


def pause(session_id: str, mode: str) -> Call[SavedSession]:
    return Call(
        "POST",
        f"/v1/sessions/{_seg(session_id)}/pause",
        lambda b: saved_from_dict(_json(b)),
        body={"mode": mode},
        refused=_refused_save,
    )


def snapshot(session_id: str, name: str, mode: str, ttl_s: float | None) -> Call[SavedSession]:
    return Call(
        "POST",
        f"/v1/sessions/{_seg(session_id)}/snapshots",
        lambda b: saved_from_dict(_json(b)),
        body={"name": name, "mode": mode, "ttl_s": ttl_s},
        refused=_refused_save,
    )


def fork(session_id: str, n: int, mode: str, *, paused: bool) -> Call[list[Mapping[str, Any]]]:
    """Fork a live session (a 404: it has ended) or a paused one (a 404: no such state)."""

    def refused(error: ServiceError) -> Any:
        if paused:
            return _state_refused(error)
        return _refused_save(error)

    return Call(
        "POST",
        f"/v1/sessions/{_seg(session_id)}/fork",
        lambda b: [dict(s) for s in _json(b)["sessions"]],
        body={"n": n, "mode": mode},
        refused=refused,
    )


def resume(session_id: str) -> Call[Mapping[str, Any]]:
    return Call("POST", f"/v1/sessions/{_seg(session_id)}/resume", _json, refused=_state_refused)


def paused() -> Call[list[SavedSession]]:
    return Call("GET", "/v1/paused", _saved_list)


def delete_paused(session_id: str) -> Call[SavedSession]:
    return Call(
        "DELETE",
        f"/v1/paused/{_seg(session_id)}",
        lambda b: saved_from_dict(_json(b)),
        refused=_state_refused,
    )


def snapshots() -> Call[list[SavedSession]]:
    return Call("GET", "/v1/snapshots", _saved_list)


def delete_snapshot(name: str) -> Call[SavedSession]:
    return Call(
        "DELETE",
        f"/v1/snapshots/{_seg(name)}",
        lambda b: saved_from_dict(_json(b)),
        refused=_state_refused,
    )


def session_from_snapshot(body: Mapping[str, Any]) -> Call[Mapping[str, Any]]:
    return Call("POST", "/v1/sessions", _json, body=body, refused=_state_refused)


def metrics(session_id: str, since: str | None) -> Call[list[SandboxMetrics]]:
    return Call(
        "GET",
        f"/v1/sessions/{_seg(session_id)}/metrics",
        lambda b: [metrics_from_dict(m) for m in _json(b)],
        params={"since": since} if since is not None else {},
        refused=_ended,
    )


# -- server-sent events ----------------------------------------------------------------------------


def read_events(lines: list[str], pending: dict[str, str]) -> Mapping[str, Any] | None:
    """Feed lines of an event stream; the data of its ``result`` event once it has come.
    ``pending`` carries a half-read event between calls."""
    for line in lines:
        if not line:
            if pending.get("event") == "result":
                return dict(_json(pending.get("data", "").encode()))
            pending.clear()
        elif line.startswith(":"):
            continue  # a keep-alive comment
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data" and "data" in pending:
                pending["data"] += "\n" + value
            else:
                pending[name] = value
    return None
