"""The plans of a remote session's background processes, terminals and watches
(``/v1/sessions/{id}/processes`` and ``.../watches``), the session's own types rebuilt from the
answers, and the reader of a followed process's event stream. Both clients carry them out
(:mod:`sandcell.client.process_methods`).

Errors come back as in-process: a process or watch the session does not have is
:class:`~sandcell.sessions.ProcessNotFound`, a refused command :class:`~sandcell.sessions.
SpawnRefused`, one that did not start (or an operation the process cannot take)
:class:`~sandcell.sessions.SpawnFailed`, a session the service no longer has
:class:`~sandcell.sessions.SessionEnded`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.client.errors import ServiceError
from sandcell.client.ops import Call, _ended, _json, _seg
from sandcell.client.streams import EventLines, event_error, event_object

if TYPE_CHECKING:
    from sandcell.sessions.processes import ProcessInfo, ProcessOutput, WatchEvent

__all__ = [
    "OutputEvents",
    "close_stdin",
    "follow_path",
    "kill",
    "output_from_dict",
    "process_refused",
    "processes",
    "read_process",
    "resize",
    "send_stdin",
    "signal",
    "spawn",
    "unwatch",
    "watch",
    "watch_events",
]

_NO_SESSION = "no session "
"""How the service's 404 for a session it does not have begins (a process's 404 does not)."""


def process_refused(error: ServiceError) -> Any:
    """The in-process error for a refused process or watch call."""
    from sandcell.sessions.processes import ProcessNotFound, SpawnFailed, SpawnRefused

    if error.status == 404 and not error.detail.startswith(_NO_SESSION):
        raise ProcessNotFound(error.detail) from None
    if error.status == 403:
        raise SpawnRefused(error.detail) from None
    if error.status == 422 and not error.errors:  # field errors: a malformed request
        raise SpawnFailed(error.detail) from None
    return _ended(error)


def _base(session_id: str) -> str:
    return f"/v1/sessions/{_seg(session_id)}"


def _proc(session_id: str, pid: int) -> str:
    return f"{_base(session_id)}/processes/{int(pid)}"


def _none(_: bytes) -> None:
    return None


def info_from_dict(data: Mapping[str, Any]) -> ProcessInfo:
    from sandcell.sessions.processes import ProcessInfo

    pty = data.get("pty")
    return ProcessInfo(
        pid=int(data["pid"]),
        argv=tuple(str(a) for a in data["argv"]),
        command=data.get("command"),
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        cwd=data.get("cwd"),
        tag=data.get("tag"),
        pty=None if not isinstance(pty, Mapping) else (int(pty["rows"]), int(pty["cols"])),
        stdin=bool(data.get("stdin")),
        started_at=float(data.get("started_at") or 0.0),
        exited=bool(data.get("exited")),
        exit_code=data.get("exit_code"),
        signal=data.get("signal"),
        run_id=data.get("run_id"),
    )


def output_from_dict(data: Mapping[str, Any]) -> ProcessOutput:
    from sandcell.sessions.processes import ProcessOutput

    return ProcessOutput(
        pid=int(data["pid"]),
        stdout=base64.b64decode(str(data.get("stdout_b64") or "")),
        stderr=base64.b64decode(str(data.get("stderr_b64") or "")),
        stdout_offset=int(data["stdout_offset"]),
        stderr_offset=int(data["stderr_offset"]),
        stdout_next=int(data["stdout_next"]),
        stderr_next=int(data["stderr_next"]),
        stdout_skipped=int(data.get("stdout_skipped") or 0),
        stderr_skipped=int(data.get("stderr_skipped") or 0),
        more=bool(data.get("more")),
        exited=bool(data.get("exited")),
        exit_code=data.get("exit_code"),
        signal=data.get("signal"),
    )


def _event_from_dict(data: Mapping[str, Any]) -> WatchEvent:
    from sandcell.sessions.processes import WatchEvent

    return WatchEvent(
        type=str(data["type"]),
        name=str(data["name"]),
        is_dir=bool(data.get("is_dir")),
        at=float(data.get("at") or 0.0),
    )


def spawn(
    session_id: str,
    cmd: str | Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: bool,
    pty: tuple[int, int] | None,
    tag: str | None,
) -> Call[ProcessInfo]:
    body: dict[str, Any] = {
        "cmd": cmd if isinstance(cmd, str) else [str(a) for a in cmd],
        "env": dict(env or {}),
        "cwd": cwd,
        "stdin": stdin,
        "pty": None if pty is None else {"rows": int(pty[0]), "cols": int(pty[1])},
        "tag": tag,
    }
    return Call(
        "POST",
        f"{_base(session_id)}/processes",
        lambda b: info_from_dict(_json(b)),
        body=body,
        refused=process_refused,
    )


def processes(session_id: str) -> Call[list[ProcessInfo]]:
    return Call(
        "GET",
        f"{_base(session_id)}/processes",
        lambda b: [info_from_dict(p) for p in _json(b)],
        refused=process_refused,
    )


def read_process(
    session_id: str, pid: int, stdout_from: int, stderr_from: int
) -> Call[ProcessOutput]:
    return Call(
        "GET",
        f"{_proc(session_id, pid)}/output",
        lambda b: output_from_dict(_json(b)),
        params={"stdout_from": int(stdout_from), "stderr_from": int(stderr_from)},
        refused=process_refused,
    )


def follow_path(session_id: str, pid: int) -> str:
    return f"{_proc(session_id, pid)}/output/stream"


def send_stdin(session_id: str, pid: int, data: bytes | str) -> Call[None]:
    body = (
        {"text": data}
        if isinstance(data, str)
        else {"data_b64": base64.b64encode(bytes(data)).decode("ascii")}
    )
    return Call(
        "POST", f"{_proc(session_id, pid)}/stdin", _none, body=body, refused=process_refused
    )


def close_stdin(session_id: str, pid: int) -> Call[None]:
    return Call("POST", f"{_proc(session_id, pid)}/stdin/close", _none, refused=process_refused)


def signal(session_id: str, pid: int, sig: int | str) -> Call[None]:
    return Call(
        "POST",
        f"{_proc(session_id, pid)}/signal",
        _none,
        body={"signal": sig if isinstance(sig, str) else int(sig)},
        refused=process_refused,
    )


def kill(session_id: str, pid: int) -> Call[None]:
    return Call("DELETE", _proc(session_id, pid), _none, refused=process_refused)


def resize(session_id: str, pid: int, rows: int, cols: int) -> Call[None]:
    return Call(
        "POST",
        f"{_proc(session_id, pid)}/resize",
        _none,
        body={"rows": int(rows), "cols": int(cols)},
        refused=process_refused,
    )


def watch(session_id: str, path: str, recursive: bool) -> Call[int]:
    return Call(
        "POST",
        f"{_base(session_id)}/watches",
        lambda b: int(_json(b)["id"]),
        body={"path": str(path), "recursive": bool(recursive)},
        refused=process_refused,
    )


def watch_events(session_id: str, watch_id: int) -> Call[list[WatchEvent]]:
    return Call(
        "GET",
        f"{_base(session_id)}/watches/{int(watch_id)}/events",
        lambda b: [_event_from_dict(e) for e in _json(b)],
        refused=process_refused,
    )


def unwatch(session_id: str, watch_id: int) -> Call[None]:
    return Call(
        "DELETE",
        f"{_base(session_id)}/watches/{int(watch_id)}",
        _none,
        refused=process_refused,
    )


class OutputEvents:
    """The lines of a followed process's event stream in; a :class:`ProcessOutput` out for
    each ``output`` and the closing ``exit`` event (then :attr:`done`); an ``error`` event is
    raised as the error the same answer would have been."""

    def __init__(self, *, what: str, where: str) -> None:
        self._what = what
        self._where = where
        self._lines = EventLines()
        self.done = False

    def feed(self, line: str) -> ProcessOutput | None:
        event = self._lines.feed(line)
        if event is None:
            return None
        kind, data = event
        if kind in ("output", "exit"):
            self.done = kind == "exit"
            return output_from_dict(event_object(data))
        if kind == "error":
            error = event_error(data, what=self._what, where=self._where)
            if isinstance(error, ServiceError):
                process_refused(error)
            raise error
        return None  # kinds a newer service may add
