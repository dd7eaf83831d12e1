"""The session server's requests for background processes and terminals
(:mod:`sandcell.sessions.server`), which ``sandcell session ps|kill|spawn|logs|attach`` send.

Each request is one :class:`~sandcell.sessions.processes.ProcessControl` call; a process and a
read travel as the JSON the HTTP service answers with (``service/process_models.py``: ``pty``
as ``{"rows", "cols"}``, output as ``stdout_b64``/``stderr_b64``), so that the command line
prints a session of this machine and one of a service alike:

* ``{"op": "spawn", "cmd": TEXT|[ARG...], "env": {..}, "cwd": DIR|null, "stdin": BOOL,
  "pty": [ROWS, COLS]|null, "tag": TEXT|null}`` -> ``{"ok": true, "process": {...}}``
* ``{"op": "processes"}`` -> ``{"ok": true, "processes": [{...}...]}``
* ``{"op": "read_process", "pid": N, "stdout_from": N, "stderr_from": N}`` ->
  ``{"ok": true, "output": {...}}``
* ``{"op": "send_stdin", "pid": N, "data_b64": B64}``, ``{"op": "close_stdin", "pid": N}``,
  ``{"op": "signal", "pid": N, "signal": N}``, ``{"op": "resize", "pid": N, "rows": N, "cols":
  N}`` -> ``{"ok": true}``
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandcell.errors import ConfigError

if TYPE_CHECKING:
    from sandcell.sessions.processes import ProcessInfo, ProcessOutput
    from sandcell.sessions.session import Session

__all__ = ["PROCESS_OPS", "output_dict", "process_dict", "process_reply"]

PROCESS_OPS = frozenset(
    {"spawn", "processes", "read_process", "send_stdin", "close_stdin", "signal", "resize"}
)


def process_dict(info: ProcessInfo) -> dict[str, Any]:
    """A process as the service's ``ProcessBody`` writes it."""
    return {
        "pid": info.pid,
        "argv": list(info.argv),
        "command": info.command,
        "env": dict(info.env),
        "cwd": info.cwd,
        "tag": info.tag,
        "pty": None if info.pty is None else {"rows": info.pty[0], "cols": info.pty[1]},
        "stdin": info.stdin,
        "started_at": info.started_at,
        "exited": info.exited,
        "exit_code": info.exit_code,
        "signal": info.signal,
        "run_id": info.run_id,
    }


def output_dict(out: ProcessOutput) -> dict[str, Any]:
    """A read as the service's ``ProcessOutputBody`` writes it."""
    return {
        "pid": out.pid,
        "stdout_b64": base64.b64encode(out.stdout).decode("ascii"),
        "stderr_b64": base64.b64encode(out.stderr).decode("ascii"),
        "stdout_offset": out.stdout_offset,
        "stderr_offset": out.stderr_offset,
        "stdout_next": out.stdout_next,
        "stderr_next": out.stderr_next,
        "stdout_skipped": out.stdout_skipped,
        "stderr_skipped": out.stderr_skipped,
        "more": out.more,
        "exited": out.exited,
        "exit_code": out.exit_code,
        "signal": out.signal,
    }


def _int(request: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = request.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"a {request.get('op')} request needs {key} (a whole number)")
    return value


def _cmd(request: Mapping[str, object]) -> str | list[str]:
    cmd = request.get("cmd")
    if isinstance(cmd, str):
        return cmd
    if isinstance(cmd, list) and all(isinstance(a, str) for a in cmd):
        return [str(a) for a in cmd]
    raise ConfigError("a spawn request needs cmd: a command line or a list of arguments")


def _spawn(session: Session, request: Mapping[str, object]) -> dict[str, object]:
    env, pty = request.get("env") or {}, request.get("pty")
    cwd, tag = request.get("cwd"), request.get("tag")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError("a spawn request's env must map names to text")
    size = None
    if pty is not None:
        if not (isinstance(pty, list) and len(pty) == 2 and all(isinstance(n, int) for n in pty)):
            raise ConfigError("a spawn request's pty must be [rows, cols]")
        size = (int(pty[0]), int(pty[1]))
    info = session.spawn(
        _cmd(request),
        env={str(k): v for k, v in env.items()},
        cwd=cwd if isinstance(cwd, str) else None,
        stdin=request.get("stdin") is True,
        pty=size,
        tag=tag if isinstance(tag, str) else None,
    )
    return {"ok": True, "process": process_dict(info)}


def process_reply(session: Session, request: Mapping[str, object]) -> dict[str, object]:
    """The reply to one of :data:`PROCESS_OPS`; its failure is raised (the server answers it as
    any request's)."""
    op = request.get("op")
    if op == "spawn":
        return _spawn(session, request)
    if op == "processes":
        return {"ok": True, "processes": [process_dict(p) for p in session.processes()]}
    pid = _int(request, "pid")
    if op == "read_process":
        got = session.read_process(
            pid,
            stdout_from=_int(request, "stdout_from", 0),
            stderr_from=_int(request, "stderr_from", 0),
        )
        return {"ok": True, "output": output_dict(got)}
    if op == "send_stdin":
        try:
            data = base64.b64decode(str(request.get("data_b64", "")), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError("a send_stdin request needs data_b64 (base64)") from None
        session.send_stdin(pid, data)
    elif op == "close_stdin":
        session.close_stdin(pid)
    elif op == "signal":
        session.signal(pid, _int(request, "signal"))
    elif op == "resize":
        session.resize(pid, _int(request, "rows"), _int(request, "cols"))
    else:
        raise ConfigError(f"unknown session request {op!r}")
    return {"ok": True}
