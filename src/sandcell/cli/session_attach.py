"""``sandcell session attach ID [PID]``: this terminal joined to a PTY process in a session.

Without PID a new ``bash -l`` is started on a terminal the size of this one (a spawn: admitted
by the session's profile and recorded as any). This terminal goes into raw mode, so every key
(^C, ^Z, arrows) reaches the process; what the process writes is copied back as it comes. A
resize of this terminal (SIGWINCH) resizes the process's. It ends when the process exits (with
its exit status, or 128 + the signal that ended it), or detaches on Ctrl-] and leaves the
process running: ``attach ID PID`` joins it again, from its output after that point.

Every key and every read is one request to the session (its server, or the service): the
process's output is polled, promptly while it flows and every :data:`POLL_S` when quiet. While
a long cell runs in the session, the terminal waits for it (as every process operation does).
"""

from __future__ import annotations

import base64
import os
import select
import signal
import sys
import termios
import tty
from typing import Any

from sandcell.cli.session_processes import Procs, exit_status, write_all
from sandcell.errors import ConfigError

__all__ = ["DETACH", "SHELL", "attach"]

DETACH = b"\x1d"
"""Ctrl-]: detaches, as telnet's escape."""
SHELL = ["/bin/bash", "-l"]
POLL_S = 0.05
_END = 1 << 62
"""An offset past any output: a read from it answers where the output ends now."""


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 24, 80
    return size.lines, size.columns


def _say(text: str) -> None:
    sys.stderr.write(f"sandcell: {text}\r\n")
    sys.stderr.flush()


def _existing(procs: Procs, pid: int) -> int:
    """Where to read ``pid``'s terminal from: where its output ends now."""
    found = next((p for p in procs.processes() if p.get("pid") == pid), None)
    if found is None:
        raise ConfigError(f"no process {pid} in this session (sandcell session ps ID lists them)")
    if found.get("pty") is None:
        raise ConfigError(
            f"process {pid} has no terminal: read it with `sandcell session logs`, or attach "
            "without a PID for a new shell"
        )
    if found.get("exited"):
        raise ConfigError(f"process {pid} has exited; `sandcell session logs` prints its output")
    procs.resize(pid, *_size())
    return int(procs.read(pid, _END, _END)["stdout_next"])


def attach(procs: Procs, session_id: str, pid: int | None) -> int:
    """Join this terminal to process ``pid`` (a new shell when None) until it exits or the
    user detaches; the exit status."""
    if not (os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())):
        raise ConfigError(
            "attach needs a terminal on stdin and stdout; without one use `sandcell session "
            "spawn`, `logs` and `kill`"
        )
    if pid is None:
        # The terminal's type, so that the shell's programs (clear, less, vim) speak it.
        term = {"TERM": os.environ.get("TERM") or "xterm"}
        info = procs.spawn(list(SHELL), pty=_size(), stdin=False, tag="attach", env=term)
        pid = int(info["pid"])
        offset = 0
    else:
        offset = _existing(procs, pid)
    _say(f"attached to pid {pid} of session {session_id}; Ctrl-] detaches")
    resized = [False]

    def on_winch(signum: int, frame: Any) -> None:
        resized[0] = True

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    previous = signal.signal(signal.SIGWINCH, on_winch)
    try:
        tty.setraw(fd)
        status = _pump(procs, pid, offset, resized)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
    if status is None:
        _say(
            f"detached; pid {pid} runs on: `sandcell session attach {session_id} {pid}` joins "
            f"it again, `sandcell session kill {session_id} {pid}` ends it"
        )
        return 0
    _say(f"pid {pid} exited ({status})")
    return status


def _pump(procs: Procs, pid: int, offset: int, resized: list[bool]) -> int | None:
    """Keys to the process, its output to this terminal; its exit status, or None when the
    user detached."""
    stdin, busy = sys.stdin.fileno(), True
    while True:
        ready = select.select([stdin], [], [], 0 if busy else POLL_S)[0]
        # After the wait: a resize that came before the keys read now reaches the process
        # before them (a `stty size` typed after a resize sees the new size).
        if resized[0]:
            resized[0] = False
            procs.resize(pid, *_size())
        typed = b""
        if ready:
            typed = os.read(stdin, 4096)
            cut = typed.find(DETACH)
            if not typed or cut >= 0:  # Ctrl-], or this terminal closed
                if cut > 0:
                    procs.send_stdin(pid, typed[:cut])
                return None
            procs.send_stdin(pid, typed)
        got = procs.read(pid, offset, 0)
        data = base64.b64decode(str(got.get("stdout_b64") or ""))
        if data:
            write_all(sys.stdout.fileno(), data)
        offset = int(got["stdout_next"])
        if got.get("exited") and not got.get("more"):
            return exit_status(got)
        busy = bool(data or typed or got.get("more"))
