"""``sandcell session start|run|list|close`` through a service: its ``/v1/sessions`` API, printed
by the same functions as the sessions this machine holds itself (the saved-session commands:
:mod:`sandcell.cli.remote_session_states`).

A session lives where it was started: one started through the service is used through it, one
started with ``--no-service`` is used with ``--no-service``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from sandcell.cli.remote import Remote, Target
from sandcell.cli.remote_run import (
    artifact_from_dict,
    download,
    input_files,
    profile_name,
    refuse_local_only,
)
from sandcell.cli.run import read_code
from sandcell.cli.session import (
    _session_limits,
    check_kernel_language,
    idle_timeout,
    max_lifetime,
    print_cell,
    print_close,
    print_list,
    refuse_settings_with_snapshot,
)
from sandcell.errors import ConfigError
from sandcell.spec import Artifact, IsolationMode, MiB

__all__ = ["handle_remote"]


def handle_remote(args: argparse.Namespace, target: Target) -> int:
    remote = Remote(target)
    match args.session_command:
        case "start":
            return _start(args, target, remote)
        case "run":
            return _run(args, remote)
        case "list":
            return _list(args, remote)
        case "close":
            return _close(args, remote)
    from sandcell.cli.remote_session_states import handle_remote_states

    return handle_remote_states(args, remote)


def _start(args: argparse.Namespace, target: Target, remote: Remote) -> int:
    refuse_local_only(
        (
            (f"--isolation {args.isolation}", args.isolation != IsolationMode.STRICT.value),
            ("--no-landlock", args.no_landlock),
            (f"--backend {args.backend}", args.backend is not None),
        ),
        target,
    )
    if idle_timeout(args) <= 0 or max_lifetime(args) <= 0:
        raise ConfigError("--idle-timeout and --max-lifetime must be positive")
    _session_limits(args)  # refused here as in-process: a value that is not positive
    check_kernel_language(args.lang)
    limits = {
        "wall_time_s": args.timeout,
        "memory_bytes": args.memory * MiB if args.memory is not None else None,
        "max_pids": args.pids,
        "cpu_time_s": args.cpu_time,
    }
    if args.snapshot is not None:
        refuse_settings_with_snapshot(args)
        body: dict[str, object] = {"snapshot": args.snapshot, "profile": args.profile}
        info = remote.json("POST", "/v1/sessions", body=body)
        print(json.dumps({"id": info["id"]}) if args.json else info["id"])
        return 0
    body = {
        "profile": profile_name(args, target),
        "limits": {k: v for k, v in limits.items() if v is not None} or None,
        "idle_timeout_s": idle_timeout(args),
        "max_lifetime_s": max_lifetime(args),
        "files": input_files(args.input),
        "on_idle": args.on_idle,
        "paused_ttl_s": args.paused_ttl,
        # Only when not the default, which a service without session languages takes too.
        **({"language": args.lang} if args.lang != "python" else {}),
    }
    info = remote.json("POST", "/v1/sessions", body=body)
    if args.json:
        print(json.dumps({"id": info["id"]}))
    else:
        print(info["id"])
    return 0


def _run(args: argparse.Namespace, remote: Remote) -> int:
    code = read_code(args)
    body = {"code": code, "timeout_s": args.timeout, "exports": list(args.export)}
    result = remote.json("POST", f"/v1/sessions/{args.id}/cells", body=body)
    assert isinstance(result, dict)
    figures = [
        artifact_from_dict(a)
        for o in result.get("outputs") or []
        for a in (o.get("artifacts") or [])
    ]
    exported = [artifact_from_dict(a) for a in result.get("artifacts") or []]
    wanted: list[Artifact] = []
    if not args.json:
        wanted = figures + (exported if args.out is not None else [])
    with tempfile.TemporaryDirectory(prefix="sandcell-download-") as tmp:
        return print_cell(args, result, download(remote, wanted, Path(tmp)))


def _list(args: argparse.Namespace, remote: Remote) -> int:
    from sandcell.cli.remote_session_states import paused_rows

    rows: list[dict[str, object]] = [
        {
            "id": s["id"],
            "state": "live",
            "pid": None,  # the service holds it
            "profile": s["profile"],
            "backend": s["backend"],
            "created_at": s["created_at"],
            "idle_timeout_s": s["idle_timeout_s"],
            "max_lifetime_s": s["max_lifetime_s"],
            "cells": s["cells"],
            "mode": None,
            "stored_bytes": None,
            "expires_at": None,
        }
        for s in (remote.json("GET", "/v1/sessions") if args.state != "paused" else [])
    ]
    if args.state != "live":
        rows += paused_rows(remote)
    return print_list(args, rows)


def _close(args: argparse.Namespace, remote: Remote) -> int:
    if args.out is not None and not args.export:
        raise ConfigError("--out needs at least one --export GLOB to say what to copy out")
    end = remote.json("POST", f"/v1/sessions/{args.id}/close", body={"exports": args.export})
    reply: dict[str, object] = {
        "ok": True,
        "artifacts": end["artifacts"],
        "rejected_exports": end["rejected_exports"],
    }
    copied: list[Path] = []
    artifacts = [artifact_from_dict(a) for a in end["artifacts"]]
    if args.out is not None and artifacts:
        with tempfile.TemporaryDirectory(prefix="sandcell-download-") as tmp:
            copied = download(remote, artifacts, Path(tmp)).copy_out(artifacts, args.out)
    return print_close(args, reply, copied)
