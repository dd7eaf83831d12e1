"""``sandcell session``: start a session, run cells in it, list sessions, close one.

A session outlives one command: ``start`` leaves a detached server holding the sandbox (see
:mod:`sandcell.sessions.server`) and prints its id; ``run ID`` sends one cell to it and prints
the result as ``sandcell run`` does; ``close ID`` ends it (optionally exporting files first).
A session also lasts beyond its server: ``pause``, ``resume``, ``fork``, ``snapshot``,
``snapshots``, ``snapshot-delete`` and ``delete`` (:mod:`sandcell.cli.session_states`), ``show``
(:mod:`sandcell.cli.session_show`); what a server opens is :mod:`sandcell.cli.session_serve`'s.
Background processes and terminals: ``ps``, ``spawn``, ``logs``, ``kill`` and ``attach``
(:mod:`sandcell.cli.session_processes`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any

from sandcell import status
from sandcell.artifacts import ArtifactStore
from sandcell.cli._own_lines import OwnLines
from sandcell.cli.options import add_backend_option, add_lang_option
from sandcell.cli.remote import add_service_option, find_service
from sandcell.cli.render import render_outputs
from sandcell.cli.run import read_code
from sandcell.errors import ConfigError, InfraError
from sandcell.home import bulk_dir
from sandcell.sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    DEFAULT_PAUSED_TTL_S,
    PauseRefused,
    SessionEnded,
    registry,
    server,
)
from sandcell.sessions.session import KERNEL_LANGUAGES
from sandcell.spec import (
    Artifact,
    DisplayOutput,
    IsolationMode,
    Limits,
    MiB,
    Outcome,
    RunResult,
    Usage,
    input_from_path,
)
from sandcell.validation import neutralise


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("session", help="stateful sessions: variables and files persist")
    # "serve" is internal (what `start` leaves running), so the listing names only the others.
    ss = s.add_subparsers(
        dest="session_command",
        required=True,
        metavar="{start,run,list,show,close,pause,resume,fork,snapshot,snapshots,"
        "snapshot-delete,delete,ps,spawn,logs,kill,attach}",
    )

    start = ss.add_parser("start", help="start a session in the background; prints its id")
    _session_options(start)
    start.add_argument(
        "--snapshot",
        metavar="NAME",
        help="start from this snapshot (its profile, limits and state; no other settings)",
    )
    start.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(start)

    serve = ss.add_parser("serve")
    _session_options(serve)
    serve.add_argument("--id", required=True)
    serve.add_argument("--ready-fd", type=int, required=True)
    serve.add_argument("--snapshot")
    serve.add_argument("--resume", action="store_true")
    serve.add_argument("--fork-from", metavar="STATE_ID")
    serve.add_argument("--parent")
    serve.add_argument("--by")

    run = ss.add_parser("run", help="run one cell in a session")
    run.add_argument("id", help="session id (see sandcell session list)")
    run.add_argument("file", nargs="?", help="cell file, or - to read the cell from stdin")
    run.add_argument("-c", dest="code", help="cell text")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="this cell's wall time")
    run.add_argument(
        "--export", action="append", default=[], metavar="GLOB", help="export after the cell"
    )
    run.add_argument(
        "--out",
        type=Path,
        help="save figures (and exported files) here (default ./sandcell-outputs/RUN_ID)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object with the result")
    add_service_option(run)

    ls = ss.add_parser("list", help="list the sessions: live ones and paused ones")
    ls.add_argument(
        "--state", choices=("live", "paused"), help="only the live or only the paused ones"
    )
    ls.add_argument("--json", action="store_true", help="print a JSON array")
    add_service_option(ls)

    close = ss.add_parser("close", help="end a session and remove its sandbox")
    close.add_argument("id")
    close.add_argument(
        "--export", action="append", default=[], metavar="GLOB", help="export before closing"
    )
    close.add_argument("--out", type=Path, help="copy exported files into this directory")
    close.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(close)

    from sandcell.cli import session_ports, session_processes, session_show, session_states

    session_show.add_parsers(ss)
    session_states.add_parsers(ss)
    session_processes.add_parsers(ss)
    session_ports.add_parsers(ss)


def _session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="policy profile for every cell (default: as sandcell run)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help=f"end the session after this long without a cell (default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-lifetime",
        type=float,
        metavar="SECONDS",
        help=f"end the session this long after its start (default {DEFAULT_MAX_LIFETIME_S:g})",
    )
    p.add_argument("--input", action="append", default=[], metavar="PATH")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="default wall time per cell")
    p.add_argument("--memory", type=int, metavar="MB", help="memory of the whole session")
    p.add_argument("--pids", type=int, metavar="N", help="processes alive at once")
    p.add_argument("--cpu-time", type=int, metavar="SECONDS", help="CPU time of the session")
    p.add_argument(
        "--isolation",
        choices=[m.value for m in IsolationMode],
        default=IsolationMode.STRICT.value,
        help="'rlimits' is a weaker mode for hosts without cgroups; it is recorded",
    )
    p.add_argument("--no-landlock", action="store_true", help="do not apply Landlock")
    p.add_argument(
        "--on-idle",
        choices=("end", "pause"),
        default="end",
        help="at the idle timeout or lifetime: end the session (default), or pause it so that "
        "`sandcell session resume ID` brings it back",
    )
    p.add_argument(
        "--paused-ttl",
        type=float,
        metavar="SECONDS",
        help=f"keep a paused state this long (default {DEFAULT_PAUSED_TTL_S:g})",
    )
    add_backend_option(p)
    add_lang_option(p, what="the session's cells'")


def home_of(args: argparse.Namespace) -> Path:
    """The data directory the command works in (``--home``, else the default)."""
    from sandcell.home import data_dir

    return Path(args.home) if args.home else data_dir()


def idle_timeout(args: argparse.Namespace) -> float:
    return DEFAULT_IDLE_TIMEOUT_S if args.idle_timeout is None else float(args.idle_timeout)


def max_lifetime(args: argparse.Namespace) -> float:
    return DEFAULT_MAX_LIFETIME_S if args.max_lifetime is None else float(args.max_lifetime)


def _common_argv(args: argparse.Namespace) -> list[str]:
    argv = [
        "--idle-timeout",
        repr(idle_timeout(args)),
        "--max-lifetime",
        repr(max_lifetime(args)),
        "--isolation",
        args.isolation,
        "--on-idle",
        args.on_idle,
    ]
    if args.paused_ttl is not None:
        argv += ["--paused-ttl", repr(args.paused_ttl)]
    if args.lang != "python":
        argv += ["--lang", args.lang]
    if args.profile:
        argv += ["--profile", args.profile]
    if args.backend:
        argv += ["--backend", args.backend]
    for p in args.input:
        argv += ["--input", str(Path(p).resolve())]
    for flag, value in (
        ("--timeout", args.timeout),
        ("--memory", args.memory),
        ("--pids", args.pids),
        ("--cpu-time", args.cpu_time),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.no_landlock:
        argv.append("--no-landlock")
    return argv


def handle(args: argparse.Namespace) -> int:
    if args.session_command != "serve":
        target = find_service(args)
        from sandcell.cli.session_processes import COMMANDS, handle_processes

        if args.session_command in COMMANDS:  # here or through the service alike
            return handle_processes(args, target)
        if target is not None:
            from sandcell.cli.remote_session import handle_remote

            return handle_remote(args, target)
    match args.session_command:
        case "start":
            return _start(args)
        case "serve":
            from sandcell.cli.session_serve import serve

            return serve(args)
        case "run":
            return _run(args)
        case "list":
            return _list(args)
        case "close":
            return _close(args)
        case "show":
            from sandcell.cli.session_show import show

            return show(args)
        case "port":
            from sandcell.cli.session_ports import forward

            return forward(args)
    from sandcell.cli.session_states import handle_states

    return handle_states(args)


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]


def _start(args: argparse.Namespace) -> int:
    if idle_timeout(args) <= 0 or max_lifetime(args) <= 0:
        raise ConfigError("--idle-timeout and --max-lifetime must be positive")
    if args.paused_ttl is not None and not (math.isfinite(args.paused_ttl) and args.paused_ttl > 0):
        raise ConfigError(f"--paused-ttl must be a positive number, got {args.paused_ttl:g}")
    _session_limits(args)  # refused here: the server's own refusal would not reach the caller
    check_kernel_language(args.lang)
    for p in args.input:
        input_from_path(p)  # refused here, with the caller's path in the message
    home = home_of(args)
    registry.sweep(home)
    session_id = new_session_id()
    registry.socket_path(home, session_id)  # a too-long path is refused before starting
    serve = ["--home", str(home), "session", "serve", "--id", session_id]
    if args.snapshot is not None:
        refuse_settings_with_snapshot(args)
        from sandcell.policy.approvals import default_approver

        argv = [*serve, "--snapshot", args.snapshot, "--by", default_approver()]
        argv += ["--profile", args.profile] if args.profile else []
    else:
        argv = [*serve, *_common_argv(args)]
    server.start_server(argv)
    if args.json:
        print(json.dumps({"id": session_id}))
    else:
        print(session_id)
    return 0


def check_kernel_language(language: str) -> None:
    """Refuse a session language no kernel runs (bash) before a server starts."""
    if language not in KERNEL_LANGUAGES:
        raise ConfigError(
            f"--lang {language}: a session's language is its kernel's, one of "
            f"{', '.join(KERNEL_LANGUAGES)}; run a {language} program with "
            f"sandcell run --lang {language}"
        )


def refuse_settings_with_snapshot(args: argparse.Namespace) -> None:
    """A session started from a snapshot takes the snapshot's settings (as
    :meth:`Executor.session <sandcell.executor.Executor.session>` says): any other is refused
    rather than dropped."""
    given = [
        flag
        for flag, value in (
            ("--idle-timeout", args.idle_timeout),
            ("--max-lifetime", args.max_lifetime),
            ("--input", args.input or None),
            ("--timeout", args.timeout),
            ("--memory", args.memory),
            ("--pids", args.pids),
            ("--cpu-time", args.cpu_time),
            ("--isolation", None if args.isolation == IsolationMode.STRICT.value else 1),
            ("--no-landlock", args.no_landlock or None),
            ("--on-idle", None if args.on_idle == "end" else 1),
            ("--lang", None if args.lang == "python" else 1),
            ("--paused-ttl", args.paused_ttl),
            ("--backend", args.backend),
        )
        if value is not None
    ]
    if given:
        raise ConfigError(
            f"a session started from a snapshot takes the snapshot's settings; {given[0]} "
            "cannot be given with --snapshot (only --profile, naming the snapshot's profile)"
        )


def _session_limits(args: argparse.Namespace) -> Limits | None:
    changes = {
        "wall_time_s": args.timeout,
        "memory_bytes": args.memory * MiB if args.memory is not None else None,
        "max_pids": args.pids,
        "cpu_time_s": args.cpu_time,
    }
    for option, value in (
        ("--timeout", args.timeout),
        ("--memory", args.memory),
        ("--pids", args.pids),
        ("--cpu-time", args.cpu_time),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{option} must be a positive number, got {value:g}")
    return Limits().with_(**changes) if any(v is not None for v in changes.values()) else None


def checked(reply: dict[str, object]) -> dict[str, object]:
    """A session server's reply, or its refusal raised as the error it was there."""
    if reply.get("ok") is True:
        return reply
    message = str(reply.get("error") or "the session server refused the request")
    kind = reply.get("kind")
    if kind == "ended":
        raise SessionEnded(message)
    if kind == "refused":
        raise PauseRefused(message)
    if kind == "config":
        raise ConfigError(message)
    raise InfraError(message)


def _run(args: argparse.Namespace) -> int:
    code = read_code(args)
    home = home_of(args)
    message: dict[str, object] = {
        "op": "run",
        "code": code,
        "timeout_s": args.timeout,
        "exports": list(args.export),
    }
    reply = checked(server.request(home, registry.check_id(args.id), message, timeout_s=None))
    result = reply["result"]
    assert isinstance(result, dict)
    return print_cell(args, result, ArtifactStore(bulk_dir(home) / "artifacts"))


def print_cell(args: argparse.Namespace, result: dict[str, object], store: ArtifactStore) -> int:
    """Print a cell's result as ``session run`` does (figures and ``--out`` copies come from
    ``store``); the exit status."""
    exit_code = status.exit_code_for(_as_result(result))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return exit_code
    stdout, stderr = str(result.get("stdout", "")), str(result.get("stderr", ""))
    outputs = _outputs_of(result)
    run_id = str(result.get("run_id"))
    rendered = render_outputs(outputs, store, args.out or Path("sandcell-outputs") / run_id)
    exported = [Artifact(**a) for a in _dicts(result.get("artifacts"))]
    copied = store.copy_out(exported, args.out) if args.out is not None and exported else []
    out_text = neutralise(stdout) if sys.stdout.isatty() else stdout
    sys.stdout.write(out_text)
    if rendered:
        sys.stdout.write(("\n" if out_text and not out_text.endswith("\n") else "") + rendered)
    sys.stdout.flush()
    sys.stderr.write(neutralise(stderr) if sys.stderr.isatty() else stderr)
    say = OwnLines(after=stderr)
    if result.get("outcome") not in ("ok", "error"):
        say(f"sandcell: {result.get('outcome')}: {result.get('reason')} (run {run_id})")
    for rej in _dicts(result.get("rejected_exports")):
        say(f"sandcell: not exported: {rej.get('path')}: {rej.get('reason')}")
    for path in copied:
        say(f"sandcell: exported {path}")
    return exit_code


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _outputs_of(result: dict[str, object]) -> list[DisplayOutput]:
    """The result's rich outputs, back from their JSON form."""
    outputs: list[DisplayOutput] = []
    for o in _dicts(result.get("outputs")):
        data = o.get("data")
        outputs.append(
            DisplayOutput(
                kind=o.get("kind", "value"),
                data={str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {},
                artifacts=tuple(Artifact(**a) for a in _dicts(o.get("artifacts"))),
            )
        )
    return outputs


def _as_result(d: dict[str, object]) -> RunResult:
    """Enough of a RunResult for the exit status (the one mapping lives in sandcell.status)."""
    code, sig = d.get("exit_code"), d.get("signal")
    return RunResult(
        run_id=str(d.get("run_id")),
        outcome=Outcome(str(d.get("outcome"))),
        exit_code=code if isinstance(code, int) else None,
        signal=sig if isinstance(sig, int) else None,
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=None,
    )


def _list(args: argparse.Namespace) -> int:
    home = home_of(args)
    rows = [] if args.state == "paused" else _local_rows(home)
    if args.state != "live":
        from sandcell.cli.session_states import paused_rows

        rows += paused_rows(home)
    return print_list(args, rows)


def _local_rows(home: Path) -> list[dict[str, object]]:
    registry.sweep(home)
    rows: list[dict[str, object]] = []
    for entry in registry.entries(home):
        row: dict[str, object] = {
            "id": entry.id,
            "state": "live",
            "pid": entry.pid,
            "profile": entry.profile,
            "backend": entry.backend,
            "created_at": entry.created_at,
            "idle_timeout_s": entry.idle_timeout_s,
            "max_lifetime_s": entry.max_lifetime_s,
            "cells": None,
            "mode": None,
            "stored_bytes": None,
            "expires_at": None,
        }
        try:
            info = checked(server.request(home, entry.id, {"op": "info"}, timeout_s=5))["info"]
            if isinstance(info, dict):
                row["cells"] = info.get("cells")
        except (SessionEnded, InfraError):
            row["cells"] = None  # busy running a cell, or just ending: listed as it registered
        rows.append(row)
    return rows


def print_list(args: argparse.Namespace, rows: list[dict[str, object]]) -> int:
    """Print the sessions as ``session list`` does: live ones (``state`` absent in a service's
    rows, which are all live), then paused ones with their stored size and expiry."""
    from sandcell.cli.session_render import expiry, size

    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print(
            {"live": "no live sessions", "paused": "no paused sessions"}.get(
                getattr(args, "state", None) or "", "no sessions"
            )
        )
        return 0
    # A service's session ids are longer than this machine's, and it has no pid to show.
    width = max(18, *(len(str(r["id"])) + 2 for r in rows))
    print(
        f"{'ID':<{width}}{'PID':>8}  {'PROFILE':<12}{'BACKEND':<12}{'CELLS':>6}  "
        f"{'STATE':<8}{'SIZE':>10}  {'EXPIRES':<21}CREATED"
    )
    for r in rows:
        cells = "?" if r["cells"] is None else str(r["cells"])
        backend = r["backend"] or "?"
        pid = "-" if r["pid"] is None else str(r["pid"])
        state = str(r.get("state") or "live")
        stored = r.get("stored_bytes")
        kept = size(stored) if isinstance(stored, int) else "-"
        expires = expiry(r.get("expires_at")) if state == "paused" else "-"
        print(
            f"{r['id']!s:<{width}}{pid:>8}  {r['profile']!s:<12}{backend!s:<12}{cells:>6}  "
            f"{state:<8}{kept:>10}  {expires:<21}{r['created_at']}"
        )
    return 0


def _close(args: argparse.Namespace) -> int:
    home = home_of(args)
    if args.out is not None and not args.export:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    reply = checked(
        server.request(
            home,
            registry.check_id(args.id),
            {"op": "close", "exports": list(args.export)},
            timeout_s=120,
        )
    )
    copied: list[Path] = []
    artifacts = reply.get("artifacts") or []
    if args.out is not None and isinstance(artifacts, list) and artifacts:
        store = ArtifactStore(bulk_dir(home) / "artifacts")
        copied = store.copy_out([Artifact(**a) for a in artifacts], args.out)
    return print_close(args, reply, copied)


def print_close(args: argparse.Namespace, reply: dict[str, object], copied: list[Path]) -> int:
    """Print the end of a session as ``session close`` does."""
    if args.json:
        print(json.dumps({**reply, "copied_to": [str(p) for p in copied]}))
        return 0
    rejected = reply.get("rejected_exports") or []
    for rej in rejected if isinstance(rejected, list) else []:
        print(f"sandcell: not exported: {rej['path']}: {rej['reason']}", file=sys.stderr)
    for path in copied:
        print(f"sandcell: exported {path}", file=sys.stderr)
    print(f"sandcell: session {args.id} closed", file=sys.stderr)
    return 0


__all__ = ["add_parser", "handle"]
