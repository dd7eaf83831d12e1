"""``sandcell session``: start a session, run cells in it, list sessions, close one.

A session outlives one command: ``start`` leaves a detached server holding the sandbox (see
:mod:`sandcell.sessions.server`) and prints its id; ``run ID`` sends one cell to it and prints
the result as ``sandcell run`` does; ``close ID`` ends it (optionally exporting files first).
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
from sandcell.cli.options import add_backend_option
from sandcell.cli.remote import add_service_option, find_service
from sandcell.cli.render import render_outputs
from sandcell.cli.run import read_code
from sandcell.errors import ConfigError, InfraError
from sandcell.sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    SessionEnded,
    registry,
    server,
)
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
    ss = s.add_subparsers(dest="session_command", required=True, metavar="{start,run,list,close}")

    start = ss.add_parser("start", help="start a session in the background; prints its id")
    _session_options(start)
    start.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(start)

    serve = ss.add_parser("serve")
    _session_options(serve)
    serve.add_argument("--id", required=True)
    serve.add_argument("--ready-fd", type=int, required=True)

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

    ls = ss.add_parser("list", help="list the live sessions")
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


def _session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="policy profile for every cell (default: as sandcell run)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"end the session after this long without a cell (default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-lifetime",
        type=float,
        default=DEFAULT_MAX_LIFETIME_S,
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
    add_backend_option(p)


def _home(args: argparse.Namespace) -> Path:
    from sandcell.executor import data_dir

    return Path(args.home) if args.home else data_dir()


def _common_argv(args: argparse.Namespace) -> list[str]:
    argv = [
        "--idle-timeout",
        repr(args.idle_timeout),
        "--max-lifetime",
        repr(args.max_lifetime),
        "--isolation",
        args.isolation,
    ]
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
        if target is not None:
            from sandcell.cli.remote_session import handle_remote

            return handle_remote(args, target)
    match args.session_command:
        case "start":
            return _start(args)
        case "serve":
            return _serve(args)
        case "run":
            return _run(args)
        case "list":
            return _list(args)
        case "close":
            return _close(args)
    raise ConfigError(f"unknown session command {args.session_command!r}")


def _start(args: argparse.Namespace) -> int:
    if args.idle_timeout <= 0 or args.max_lifetime <= 0:
        raise ConfigError("--idle-timeout and --max-lifetime must be positive")
    _session_limits(args)  # refused here: the server's own refusal would not reach the caller
    for p in args.input:
        input_from_path(p)  # refused here, with the caller's path in the message
    home = _home(args)
    registry.sweep(home)
    session_id = uuid.uuid4().hex[:16]
    registry.socket_path(home, session_id)  # a too-long path is refused before starting
    argv = ["--home", str(home), "session", "serve", "--id", session_id, *_common_argv(args)]
    server.start_server(argv)
    if args.json:
        print(json.dumps({"id": session_id}))
    else:
        print(session_id)
    return 0


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


def _serve(args: argparse.Namespace) -> int:
    from sandcell.executor import Executor

    limits = _session_limits(args)
    home = _home(args)
    return server.serve(
        home=home,
        session_id=registry.check_id(args.id),
        open_executor=lambda: Executor(home=home, profile=args.profile, backend=args.backend),
        limits=limits,
        inputs=tuple(input_from_path(p) for p in args.input),
        mode=IsolationMode(args.isolation),
        landlock=False if args.no_landlock else None,
        idle_timeout_s=args.idle_timeout,
        max_lifetime_s=args.max_lifetime,
        ready_fd=args.ready_fd,
    )


def _checked(reply: dict[str, object]) -> dict[str, object]:
    if reply.get("ok") is True:
        return reply
    message = str(reply.get("error") or "the session server refused the request")
    kind = reply.get("kind")
    if kind == "ended":
        raise SessionEnded(message)
    if kind == "config":
        raise ConfigError(message)
    raise InfraError(message)


def _run(args: argparse.Namespace) -> int:
    code = read_code(args)
    home = _home(args)
    message: dict[str, object] = {
        "op": "run",
        "code": code,
        "timeout_s": args.timeout,
        "exports": list(args.export),
    }
    reply = _checked(server.request(home, registry.check_id(args.id), message, timeout_s=None))
    result = reply["result"]
    assert isinstance(result, dict)
    return print_cell(args, result, ArtifactStore(home / "artifacts"))


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
    home = _home(args)
    rows = _local_rows(home)
    return print_list(args, rows)


def _local_rows(home: Path) -> list[dict[str, object]]:
    registry.sweep(home)
    rows: list[dict[str, object]] = []
    for entry in registry.entries(home):
        row: dict[str, object] = {
            "id": entry.id,
            "pid": entry.pid,
            "profile": entry.profile,
            "backend": entry.backend,
            "created_at": entry.created_at,
            "idle_timeout_s": entry.idle_timeout_s,
            "max_lifetime_s": entry.max_lifetime_s,
            "cells": None,
        }
        try:
            info = _checked(server.request(home, entry.id, {"op": "info"}, timeout_s=5))["info"]
            if isinstance(info, dict):
                row["cells"] = info.get("cells")
        except (SessionEnded, InfraError):
            row["cells"] = None  # busy running a cell, or just ending: listed as it registered
        rows.append(row)
    return rows


def print_list(args: argparse.Namespace, rows: list[dict[str, object]]) -> int:
    """Print the live sessions as ``session list`` does."""
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no live sessions")
        return 0
    # A service's session ids are longer than this machine's, and it has no pid to show.
    width = max(18, *(len(str(r["id"])) + 2 for r in rows))
    print(f"{'ID':<{width}}{'PID':>8}  {'PROFILE':<12}{'BACKEND':<12}{'CELLS':>6}  CREATED")
    for r in rows:
        cells = "?" if r["cells"] is None else str(r["cells"])
        backend = r["backend"] or "?"
        pid = "-" if r["pid"] is None else str(r["pid"])
        print(
            f"{r['id']!s:<{width}}{pid:>8}  {r['profile']!s:<12}{backend!s:<12}{cells:>6}  "
            f"{r['created_at']}"
        )
    return 0


def _close(args: argparse.Namespace) -> int:
    home = _home(args)
    if args.out is not None and not args.export:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    reply = _checked(
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
        store = ArtifactStore(home / "artifacts")
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
