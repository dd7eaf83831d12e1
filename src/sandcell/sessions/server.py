"""The session server: a detached process that holds one :class:`Session` for the CLI.

``sandcell session start`` starts ``sandcell session serve`` in a new session (setsid), with its
standard streams on ``/dev/null``, so it outlives the command that started it and owns no
terminal. The server opens the session, listens on ``<data dir>/sessions/ID.sock`` (mode 0600,
connections from other users refused by their peer credentials), registers itself, reports
``ok`` (or the error) on the ready descriptor its starter waits on, then serves one request at a
time until the session ends: closed, idle timeout, maximum lifetime, or killed. It then removes
its socket and registry entry; if it is killed instead, the next ``sandcell session`` command
sweeps them (see :mod:`sandcell.sessions.registry`).

Requests and replies are framed JSON objects (:mod:`sandcell.backends.cell.channel`):

* ``{"op": "run", "code": TEXT, "timeout_s": S|null, "exports": [GLOB...]}`` ->
  ``{"ok": true, "result": <result_to_dict>}``
* ``{"op": "info"}`` -> ``{"ok": true, "info": {...}}``
* ``{"op": "close", "exports": [GLOB...]}`` -> ``{"ok": true, "artifacts": [...], ...}``
* any failure -> ``{"ok": false, "error": MESSAGE, "kind": "config"|"infra"|"ended"}``
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
from sandcell.errors import ConfigError, InfraError, SandcellError
from sandcell.sessions import registry
from sandcell.sessions.session import Session, SessionEnded
from sandcell.spec import InputFile, IsolationMode, Limits, artifact_to_dict, result_to_dict

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
    limits: Limits | None,
    inputs: tuple[InputFile, ...],
    mode: IsolationMode,
    landlock: bool | None,
    idle_timeout_s: float,
    max_lifetime_s: float,
    ready_fd: int,
) -> int:
    """Run the server until the session ends; returns the process exit status.
    ``open_executor`` builds the executor the session runs on (the caller's profile and rung):
    here, so that its refusal reaches the starting command like the session's own."""
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
                session = Session(
                    ex,
                    limits=limits,
                    inputs=inputs,
                    mode=mode,
                    landlock=landlock,
                    idle_timeout_s=idle_timeout_s,
                    max_lifetime_s=max_lifetime_s,
                    session_id=session_id,
                )
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
                        idle_timeout_s=idle_timeout_s,
                        max_lifetime_s=max_lifetime_s,
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
        raise ConfigError(f"unknown session request {op!r}")
    except SandcellError as exc:
        return _error(exc), False


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
        raise SessionEnded(
            f"no live session {session_id} (it was closed, timed out, or never existed); "
            "see `sandcell session list`"
        )
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


__all__ = ["MAX_REQUEST", "request", "serve", "start_server"]
