"""The session server: a detached process that holds one :class:`Session` for the CLI.

``sandcell session start`` starts ``sandcell session serve`` in a new session (setsid), with its
standard streams on ``/dev/null``, so it outlives the command that started it and owns no
terminal. The server opens the session, listens on ``<data dir>/sessions/ID.sock`` (mode 0600,
connections from other users refused by their peer credentials), registers itself, reports
``ok`` (or the error) on the ready descriptor its starter waits on, then serves one request at a
time until the session ends: closed, paused, idle timeout, maximum lifetime, or killed. It then
removes its socket and registry entry; if it is killed instead, the next ``sandcell session``
command sweeps them (see :mod:`sandcell.sessions.registry`). What it opens (a new session, or one
brought back from a saved state) is its starter's choice (:mod:`sandcell.cli.session_serve`).

Requests and replies are framed JSON objects (:mod:`sandcell.backends.cell.channel`):

* ``{"op": "run", "code": TEXT, "timeout_s": S|null, "exports": [GLOB...]}`` ->
  ``{"ok": true, "result": <result_to_dict>}``
* ``{"op": "info"}`` -> ``{"ok": true, "info": {...}}``
* ``{"op": "metrics", "since": ISO|null}`` -> ``{"ok": true, "metrics": [<to_dict>...]}``
* ``{"op": "close", "exports": [GLOB...]}`` -> ``{"ok": true, "artifacts": [...], ...}``
* ``{"op": "pause", "mode": M|null, "by": WHO}`` -> ``{"ok": true, "state": <summary>}``; the
  session's sandbox is gone and the server exits (the state stays under the home; ``sandcell
  session resume`` starts a server that brings it back under the same id). A null mode is the
  best the rung offers (memory, else files), here and below
* ``{"op": "snapshot", "name": N, "mode": M|null, "ttl_s": S|null, "by": WHO}`` ->
  ``{"ok": true, "state": <summary>}``
* ``{"op": "fork_point", "mode": M|null}`` -> ``{"ok": true, "state": <summary>}``: the state the
  caller starts each copy's server from (:meth:`Session.fork_point`)
* background processes and terminals (``spawn``, ``processes``, ``read_process``,
  ``send_stdin``, ``close_stdin``, ``signal``, ``resize``):
  :mod:`sandcell.sessions.server_processes`
* a session's port forwards (``forward_port``, ``stop_forward``):
  :mod:`sandcell.sessions.server_ports`
* any failure -> ``{"ok": false, "error": MESSAGE, "kind": "config"|"infra"|"ended"|"refused"}``
  (``refused``: a pause mode this session's rung does not offer; the session goes on)

A session that pauses itself at its idle timeout (``on_idle = "pause"``) ends the server the
same way.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sandcell.backends.cell.channel import ChannelError, recv_message, send_message
from sandcell.backends.cell.state import PauseMode, PauseRefused
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.home import bulk_dir
from sandcell.sessions import registry
from sandcell.sessions.server_ports import PORT_OPS, port_reply
from sandcell.sessions.server_processes import PROCESS_OPS, process_reply
from sandcell.sessions.session import Session, SessionEnded
from sandcell.sessions.states import StateNotFound, StateStore, StateTampered, StoredState
from sandcell.spec import artifact_to_dict, result_to_dict

if TYPE_CHECKING:
    from sandcell.executor import Executor

MAX_REQUEST = 64 * 1024 * 1024
_POLL_S = 0.5


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _error(exc: BaseException) -> dict[str, object]:
    kind = (
        "ended"
        if isinstance(exc, SessionEnded)
        else "refused"
        if isinstance(exc, PauseRefused)
        else "config"
        if isinstance(exc, ConfigError)
        else "infra"
    )
    return {"ok": False, "error": str(exc), "kind": kind}


class _Stop(BaseException):
    """SIGTERM or SIGINT: end the session and exit.

    A BaseException, as KeyboardInterrupt is: a request's ``except SandcellError`` (or any
    handler of errors) must not turn the signal into an error reply and serve on."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def serve(
    *,
    home: Path,
    session_id: str,
    open_executor: Callable[[], Executor],
    open_session: Callable[[Executor], Session],
    ready_fd: int,
) -> int:
    """Run the server until the session ends; returns the process exit status.
    ``open_executor`` builds the executor the session runs on (the caller's profile and rung)
    and ``open_session`` opens the session ``session_id`` on it (a new one, or one brought back
    from a saved state): here, so that their refusals reach the starting command."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    sock_path = registry.socket_path(home, session_id)
    listener: socket.socket | None = None
    try:
        try:
            executor = open_executor()
        except SandcellError as exc:
            # A bad profile, or a backend the profile refuses: the starting command prints it.
            os.write(ready_fd, f"error {exc}\n".encode())
            return 1
        with executor as ex:
            try:
                session = open_session(ex)
                if session.id != session_id:
                    session.close()
                    raise InfraError(f"the session opened as {session.id}, not {session_id}")
            except SandcellError as exc:
                os.write(ready_fd, f"error {exc}\n".encode())
                return 1
            try:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                old = os.umask(0o177)
                try:
                    listener.bind(str(sock_path))
                finally:
                    os.umask(old)
                listener.listen(8)
                registry.write(
                    home,
                    registry.Entry(
                        id=session_id,
                        pid=os.getpid(),
                        owner=_owner(),
                        profile=session.profile.name,
                        backend=session.info().backend,
                        created_at=session.created_at,
                        idle_timeout_s=session.idle_timeout_s,
                        max_lifetime_s=session.max_lifetime_s,
                        language=session.language,
                    ),
                )
                os.write(ready_fd, b"ok\n")
                os.close(ready_fd)
                _loop(listener, session)
            except _Stop:
                pass
            finally:
                session.close()
    finally:
        if listener is not None:
            listener.close()
        registry.remove(home, session_id)
    return 0


def _owner() -> str:
    from sandcell.backends.host import workspace

    return workspace.owner_tag()


def _loop(listener: socket.socket, session: Session) -> None:
    while session.ended is None:
        if not select.select([listener], [], [], _POLL_S)[0]:
            continue
        conn, _ = listener.accept()
        with conn:
            if _peer_uid(conn) != os.getuid():
                continue  # another user: no answer at all
            try:
                request = recv_message(conn, max_bytes=MAX_REQUEST, timeout_s=30)
            except ChannelError:
                continue
            reply, closing = _handle(session, request)
            with contextlib.suppress(OSError):
                send_message(conn, reply)
            if closing:
                return


def _handle(session: Session, request: dict[str, object]) -> tuple[dict[str, object], bool]:
    op = request.get("op")
    try:
        if op == "run":
            code = request.get("code")
            timeout = request.get("timeout_s")
            exports = request.get("exports") or []
            if not isinstance(code, str) or not isinstance(exports, list):
                raise ConfigError("a run request needs code (text) and exports (a list)")
            result = session.run(
                code,
                timeout_s=float(timeout) if isinstance(timeout, int | float) else None,
                exports=[str(g) for g in exports],
            )
            return {"ok": True, "result": result_to_dict(result)}, False
        if op == "info":
            return {"ok": True, "info": asdict(session.info())}, False
        if op == "metrics":
            since = request.get("since")
            samples = session.metrics(since if isinstance(since, str) else None)
            return {"ok": True, "metrics": [m.to_dict() for m in samples]}, False
        if op == "pause":
            state = session.pause(mode=_mode(request, session), by=_by(request))
            return {"ok": True, "state": state.summary()}, True
        if op == "snapshot":
            name, ttl = request.get("name"), request.get("ttl_s")
            if not isinstance(name, str) or not (ttl is None or isinstance(ttl, int | float)):
                raise ConfigError("a snapshot request needs a name (text) and ttl_s (seconds)")
            state = session.snapshot(
                name,
                mode=_mode(request, session),
                ttl_s=None if ttl is None else float(ttl),
                by=_by(request),
            )
            return {"ok": True, "state": state.summary()}, False
        if op == "fork_point":
            point = session.fork_point(mode=_mode(request, session))
            return {"ok": True, "state": point.summary()}, False
        if op == "close":
            exports = request.get("exports") or []
            if not isinstance(exports, list):
                raise ConfigError("exports must be a list of globs")
            end = session.close(exports=[str(g) for g in exports])
            return {
                "ok": True,
                "artifacts": [artifact_to_dict(a) for a in end.artifacts],
                "rejected_exports": [
                    {"path": r.path, "reason": r.reason} for r in end.rejected_exports
                ],
            }, True
        if op in PROCESS_OPS:
            return process_reply(session, request), False
        if op in PORT_OPS:
            return port_reply(session, request), False
        raise ConfigError(f"unknown session request {op!r}")
    except SandcellError as exc:
        if isinstance(exc, SessionEnded) and session.ended == "paused":
            # Paused (by a request or at its idle timeout) while this one waited: say how it
            # comes back, as for a request that finds no server.
            return _error(SessionEnded(_paused(session.id))), False
        return _error(exc), False


def _mode(request: dict[str, object], session: Session) -> PauseMode:
    """The mode asked for; none: the best the session's rung offers (memory, else files)."""
    mode = request.get("mode")
    if mode is None:
        return PauseMode.MEMORY if PauseMode.MEMORY in session.pause_modes else PauseMode.FILES
    if mode not in tuple(PauseMode):
        modes = ", ".join(m.value for m in PauseMode)
        raise ConfigError(f"mode must be one of {modes}, not {mode!r}")
    return PauseMode(str(mode))


def _by(request: dict[str, object]) -> str | None:
    by = request.get("by")
    return by if isinstance(by, str) else None


# -- the client side ------------------------------------------------------------------------------


def start_server(argv: list[str], *, timeout_s: float = 120) -> None:
    """Start ``sandcell ... session serve`` detached and wait until it serves (or says why not).

    ``argv`` is the serve command line after ``python -m sandcell``; ``--ready-fd`` is added.
    """
    ready_r, ready_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandcell", *argv, "--ready-fd", str(ready_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ready_w,),
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(ready_r)
        raise InfraError(f"could not start the session server: {exc}") from exc
    finally:
        os.close(ready_w)
    try:
        data = b""
        deadline = time.monotonic() + timeout_s
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([ready_r], [], [], remaining)[0]:
                proc.kill()
                raise InfraError(f"the session server did not start within {timeout_s:g} s")
            chunk = os.read(ready_r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(ready_r)
    text = data.decode(errors="replace").strip()
    if text == "ok":
        return
    # The server has exited (or is about to); reap it so no zombie is left behind.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if text.startswith("error "):
        raise ConfigError(text[len("error ") :])
    raise InfraError(f"the session server exited before it served (status {proc.poll()})")


def request(
    home: Path, session_id: str, message: dict[str, object], *, timeout_s: float | None
) -> dict[str, object]:
    """Send one request to a session's server and return its reply."""
    entry = registry.read(home, session_id)
    if entry is None or not entry.alive():
        registry.remove(home, session_id)
        raise SessionEnded(not_live(home, session_id))
    path = registry.socket_path(home, session_id)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise SessionEnded(f"session {session_id} does not answer: {exc}") from exc
        # The code goes only to a server of this user: a socket planted by someone else (where a
        # parent of the data directory is theirs) would read it and could answer anything.
        owner = _peer_uid(sock)
        if owner != os.getuid():
            raise SessionEnded(
                f"the socket of session {session_id} ({path}) is served by uid {owner}, not by "
                "you; it was not sent the cell. Check who can write to the sandcell data directory"
            )
        send_message(sock, message)
        try:
            return recv_message(sock, max_bytes=MAX_REQUEST, timeout_s=timeout_s)
        except ChannelError as exc:
            raise InfraError(f"session {session_id} did not answer: {exc}") from exc


def paused_state(home: Path, session_id: str) -> StoredState | None:
    """This user's paused state of ``session_id`` (manifest checked, files not yet), or None.
    Raises StateTampered for one whose manifest changed on disk."""
    try:
        with StateStore(bulk_dir(home) / "states") as states:
            state = states.get(registry.check_id(session_id), owner=None)
    except StateNotFound:
        return None
    return state if state.kind == "paused" else None


def _paused(session_id: str) -> str:
    return (
        f"session {session_id} is paused: resume it with `sandcell session resume "
        f"{session_id}` (or delete it with `sandcell session delete {session_id}`)"
    )


def not_live(home: Path, session_id: str) -> str:
    """Why ``session_id`` has no server to send a request to, and what to do about it."""
    try:
        paused = paused_state(home, session_id)
    except StateTampered as exc:
        return f"session {session_id} is paused, but {exc}"
    if paused is not None:
        return _paused(session_id)
    return (
        f"no live session {session_id} (it was closed, timed out, or never existed); "
        "see `sandcell session list`"
    )


__all__ = ["MAX_REQUEST", "not_live", "paused_state", "request", "serve", "start_server"]
