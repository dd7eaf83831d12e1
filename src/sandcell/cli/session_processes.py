"""``sandcell session ps|kill|spawn|logs|attach``: a session's background processes and
terminals from the command line.

The same commands reach a session this machine holds (its detached server's process requests,
:mod:`sandcell.sessions.server_processes`) and one a service holds (its
``/v1/sessions/{id}/processes`` API): both answer with the same JSON, read here by
:class:`Procs`. ``attach`` is :mod:`sandcell.cli.session_attach`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal as signals
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandcell.cli.remote import Remote, Target, add_service_option
from sandcell.errors import ConfigError

__all__ = [
    "COMMANDS",
    "Procs",
    "add_parsers",
    "exit_status",
    "handle_processes",
    "procs_for",
    "terminal_size",
    "write_all",
]

COMMANDS = frozenset({"ps", "kill", "spawn", "logs", "attach"})
FOLLOW_PAUSE_S = 0.1
"""Between reads of a followed process that wrote nothing new."""


class Procs(Protocol):
    """One session's processes, wherever it lives; processes and reads as the service's JSON."""

    def spawn(
        self,
        cmd: str | list[str],
        *,
        pty: tuple[int, int] | None,
        stdin: bool,
        tag: str | None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]: ...
    def processes(self) -> list[dict[str, Any]]: ...
    def read(self, pid: int, stdout_from: int, stderr_from: int) -> dict[str, Any]: ...
    def send_stdin(self, pid: int, data: bytes) -> None: ...
    def signal(self, pid: int, sig: int) -> None: ...
    def resize(self, pid: int, rows: int, cols: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Local:
    """A session of this machine: requests to its server."""

    home: Path
    session_id: str

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        from sandcell.cli.session import checked
        from sandcell.sessions import registry, server

        sid = registry.check_id(self.session_id)
        return checked(server.request(self.home, sid, message, timeout_s=None))

    def spawn(
        self,
        cmd: str | list[str],
        *,
        pty: tuple[int, int] | None,
        stdin: bool,
        tag: str | None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        message = {"op": "spawn", "cmd": cmd, "pty": None if pty is None else list(pty),
                   "stdin": stdin, "tag": tag, "env": env or {}}  # fmt: skip
        return dict(self._ask(message)["process"])

    def processes(self) -> list[dict[str, Any]]:
        found = self._ask({"op": "processes"})["processes"]
        return [dict(p) for p in found] if isinstance(found, list) else []

    def read(self, pid: int, stdout_from: int, stderr_from: int) -> dict[str, Any]:
        message = {"op": "read_process", "pid": pid, "stdout_from": stdout_from,
                   "stderr_from": stderr_from}  # fmt: skip
        return dict(self._ask(message)["output"])

    def send_stdin(self, pid: int, data: bytes) -> None:
        self._ask({"op": "send_stdin", "pid": pid, "data_b64": base64.b64encode(data).decode()})

    def signal(self, pid: int, sig: int) -> None:
        self._ask({"op": "signal", "pid": pid, "signal": sig})

    def resize(self, pid: int, rows: int, cols: int) -> None:
        self._ask({"op": "resize", "pid": pid, "rows": rows, "cols": cols})


@dataclass(frozen=True, slots=True)
class _Remote:
    """A session of a service: its process API."""

    remote: Remote
    session_id: str

    @property
    def _base(self) -> str:
        return f"/v1/sessions/{self.session_id}/processes"

    def spawn(
        self,
        cmd: str | list[str],
        *,
        pty: tuple[int, int] | None,
        stdin: bool,
        tag: str | None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        size = None if pty is None else {"rows": pty[0], "cols": pty[1]}
        body = {"cmd": cmd, "pty": size, "stdin": stdin, "tag": tag, "env": env or {}}
        return dict(self.remote.json("POST", self._base, body=body))

    def processes(self) -> list[dict[str, Any]]:
        return [dict(p) for p in self.remote.json("GET", self._base)]

    def read(self, pid: int, stdout_from: int, stderr_from: int) -> dict[str, Any]:
        query: dict[str, str | int] = {"stdout_from": stdout_from, "stderr_from": stderr_from}
        return dict(self.remote.json("GET", f"{self._base}/{pid}/output", query=query))

    def send_stdin(self, pid: int, data: bytes) -> None:
        body = {"data_b64": base64.b64encode(data).decode()}
        self.remote.call("POST", f"{self._base}/{pid}/stdin", body=body)

    def signal(self, pid: int, sig: int) -> None:
        self.remote.call("POST", f"{self._base}/{pid}/signal", body={"signal": sig})

    def resize(self, pid: int, rows: int, cols: int) -> None:
        body = {"rows": rows, "cols": cols}
        self.remote.call("POST", f"{self._base}/{pid}/resize", body=body)


def procs_for(args: argparse.Namespace, target: Target | None) -> Procs:
    """The processes of session ``args.id``: through the service when one is configured (where
    a session started through it lives), else its server on this machine."""
    if target is not None:
        return _Remote(Remote(target), args.id)
    from sandcell.cli.session import home_of

    return _Local(home_of(args), args.id)


def add_parsers(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ps = ss.add_parser("ps", help="list a session's background processes")
    ps.add_argument("id")
    ps.add_argument("--json", action="store_true", help="print a JSON array")
    add_service_option(ps)

    spawn = ss.add_parser(
        "spawn",
        help="start a command in the background in a session; prints its pid",
        description="sandcell session spawn ID [OPTIONS] -- CMD...: one word after -- is a "
        "Bash command line (run as bash -l -c, as a Bash cell); several are the program and its "
        "arguments.",
    )
    spawn.add_argument("id")
    spawn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- CMD...")
    _spawn_options(spawn)
    add_service_option(spawn)

    logs = ss.add_parser("logs", help="print a background process's output (stdout, stderr)")
    logs.add_argument("id")
    logs.add_argument("pid", type=int)
    logs.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing until it exits; the exit status is then the process's",
    )
    add_service_option(logs)

    kill = ss.add_parser("kill", help="send a signal to a background process and its group")
    kill.add_argument("id")
    kill.add_argument("pid", type=int)
    kill.add_argument(
        "--signal", "-s", default="TERM", help="a name (TERM, KILL, INT...) or number; TERM"
    )
    add_service_option(kill)

    attach = ss.add_parser(
        "attach",
        help="a terminal on the session: bash on a PTY there (Ctrl-] detaches)",
        description="This terminal in raw mode, joined to a PTY process in the session: a new "
        "bash, or the terminal process PID. Ends when that process exits (with its status), "
        "or detaches on Ctrl-], leaving it running for a later attach.",
    )
    attach.add_argument("id")
    attach.add_argument("pid", type=int, nargs="?", help="attach to this PTY process instead")
    add_service_option(attach)


def _spawn_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pty", action="store_true", help="on a terminal the size of this one (else 24x80)"
    )
    p.add_argument("--stdin", action="store_true", help="keep its input open")
    p.add_argument("--tag", help="a label shown by ps")
    p.add_argument("--json", action="store_true", help="print the process as JSON")


def _split_spawn(args: argparse.Namespace) -> list[str]:
    """The command of ``spawn ID [OPTIONS] -- CMD...``; the options between ID and ``--`` are
    read into ``args`` (argparse hands everything after ID to the command)."""
    rest: list[str] = list(args.cmd)
    if "--" not in rest:
        return rest
    cut = rest.index("--")
    options = argparse.ArgumentParser(prog="sandcell session spawn ID", add_help=False)
    _spawn_options(options)
    options.parse_args(rest[:cut], namespace=args)
    return rest[cut + 1 :]


def handle_processes(args: argparse.Namespace, target: Target | None) -> int:
    procs = procs_for(args, target)
    match args.session_command:
        case "ps":
            return _ps(args, procs)
        case "spawn":
            return _spawn(args, procs)
        case "logs":
            return _logs(args, procs)
        case "kill":
            procs.signal(args.pid, signal_number(args.signal))
            return 0
    from sandcell.cli.session_attach import attach

    return attach(procs, args.id, args.pid)


def signal_number(value: str) -> int:
    """A signal's number from its name (``TERM``, ``SIGTERM``) or number."""
    if value.isdigit():
        return int(value)
    name = value.strip().upper()
    found = getattr(signals.Signals, name if name.startswith("SIG") else f"SIG{name}", None)
    if found is None:
        raise ConfigError(f"--signal {value!r}: give a signal's name (TERM, KILL, INT) or number")
    return int(found)


def terminal_size() -> tuple[int, int]:
    """(rows, cols) of this terminal; 24x80 when there is none."""
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


def _spawn(args: argparse.Namespace, procs: Procs) -> int:
    words = _split_spawn(args)
    if not words:
        raise ConfigError("give the command after --: sandcell session spawn ID -- CMD...")
    cmd: str | list[str] = words[0] if len(words) == 1 else list(words)
    info = procs.spawn(
        cmd, pty=terminal_size() if args.pty else None, stdin=args.stdin, tag=args.tag
    )
    print(json.dumps(info) if args.json else info["pid"])
    return 0


def state_of(p: dict[str, Any]) -> str:
    if not p.get("exited"):
        return "running"
    if p.get("signal") is not None:
        try:
            return f"killed ({signals.Signals(int(p['signal'])).name})"
        except ValueError:
            return f"killed ({p['signal']})"
    return f"exited {p.get('exit_code')}"


def _ps(args: argparse.Namespace, procs: Procs) -> int:
    found = procs.processes()
    if args.json:
        print(json.dumps(found))
        return 0
    if not found:
        print("no processes")
        return 0
    print(f"{'PID':>7}  {'STATE':<18}{'TTY':<10}{'TAG':<14}{'STARTED':<10}COMMAND")
    for p in found:
        pty = p.get("pty")
        tty = f"{pty['rows']}x{pty['cols']}" if isinstance(pty, dict) else "-"
        started = time.strftime("%H:%M:%S", time.localtime(float(p.get("started_at") or 0)))
        command = p.get("command") or " ".join(p.get("argv") or ())
        tag = str(p.get("tag") or "-")
        print(f"{p['pid']:>7}  {state_of(p):<18}{tty:<10}{tag:<14}{started:<10}{command}")
    return 0


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a pipe or a terminal may take it in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def exit_status(out: dict[str, Any]) -> int:
    """The shell's way of telling an exited process's end: its code, or 128 + its signal."""
    if out.get("signal") is not None:
        return 128 + int(out["signal"])
    code = out.get("exit_code")
    return int(code) if isinstance(code, int) else 0


def _logs(args: argparse.Namespace, procs: Procs) -> int:
    out_from = err_from = 0
    while True:
        got = procs.read(args.pid, out_from, err_from)
        for fd, key, skipped in ((1, "stdout_b64", "stdout_skipped"),
                                 (2, "stderr_b64", "stderr_skipped")):  # fmt: skip
            if got.get(skipped):
                print(f"sandcell: {got[skipped]} bytes of its output were no longer kept",
                      file=sys.stderr)  # fmt: skip
            data = base64.b64decode(str(got.get(key) or ""))
            if data:
                sys.stdout.flush()
                write_all(fd, data)
        out_from, err_from = int(got["stdout_next"]), int(got["stderr_next"])
        if got.get("more"):
            continue
        if not args.follow:
            return 0
        if got.get("exited"):
            return exit_status(got)
        time.sleep(FOLLOW_PAUSE_S)
