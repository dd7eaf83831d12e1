"""``sandcell session pause|resume|fork|snapshot|snapshots|snapshot-delete|delete``: sessions
that outlast their server.

A pause asks the session's server to save the session under the home and exit; ``resume ID``
starts a new detached server that brings it back under the same id (also after the first server
died or the host restarted: the state on disk is all it needs). A fork asks the server for a
fork point (or takes a paused session's state as it is), starts one server per copy, each
restoring from it, records the one ``fork`` event once all started (or closes those that did,
all or none), and drops the fork point. Snapshots are named states that new sessions start from
(``session start --snapshot NAME``). The saved states themselves are
:mod:`sandcell.sessions.states`'; what each server opens is :mod:`sandcell.cli.session_serve`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandcell.audit.record import utc_now
from sandcell.cli.remote import add_service_option
from sandcell.cli.session import checked, home_of, new_session_id
from sandcell.cli.session_render import size, state_line
from sandcell.errors import ConfigError, SandcellError
from sandcell.home import bulk_dir
from sandcell.policy.approvals import default_approver
from sandcell.sessions import MAX_FORKS, PauseMode, SessionEnded, registry, saving, server
from sandcell.sessions.states import StateNotFound, StateStore, StoredState

_SAVE_TIMEOUT_S = 600.0
"""How long a client waits for a save (a VM's memory under emulation takes a while)."""
_PARALLEL_STARTS = 4
"""Copies' servers started at once: each starts an interpreter and a sandbox, and a host with
few cores does them no faster all together."""


def add_parsers(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    modes = [m.value for m in PauseMode]
    mode_help = "memory (variables, processes, files) or files; default: the best the rung offers"

    pause = ss.add_parser("pause", help="save a session under the home and end its sandbox")
    pause.add_argument("id")
    pause.add_argument("--mode", choices=modes, help=mode_help)
    pause.add_argument("--json", action="store_true", help="print the saved state as JSON")
    add_service_option(pause)

    resume = ss.add_parser("resume", help="bring a paused session back under its id")
    resume.add_argument("id")
    resume.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(resume)

    fork = ss.add_parser("fork", help="copy a live or paused session into new sessions")
    fork.add_argument("id")
    fork.add_argument("-n", type=int, default=1, help=f"copies, 1 to {MAX_FORKS} (default 1)")
    fork.add_argument("--mode", choices=modes, help=mode_help + " (a paused one: as it was kept)")
    fork.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(fork)

    snap = ss.add_parser("snapshot", help="keep a named copy of a live session's state")
    snap.add_argument("id")
    snap.add_argument("name")
    snap.add_argument("--mode", choices=modes, help=mode_help)
    snap.add_argument("--ttl", type=float, metavar="SECONDS", help="remove it after this long")
    snap.add_argument("--json", action="store_true", help="print the saved state as JSON")
    add_service_option(snap)

    snaps = ss.add_parser("snapshots", help="list the snapshots")
    snaps.add_argument("--json", action="store_true", help="print a JSON array")
    add_service_option(snaps)

    snap_delete = ss.add_parser("snapshot-delete", help="delete a snapshot")
    snap_delete.add_argument("name")
    snap_delete.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(snap_delete)

    delete = ss.add_parser("delete", help="delete a paused session for good")
    delete.add_argument("id")
    delete.add_argument("--json", action="store_true", help="print a JSON object")
    add_service_option(delete)


def handle_states(args: argparse.Namespace) -> int:
    match args.session_command:
        case "pause":
            return _pause(args)
        case "resume":
            return _resume(args)
        case "fork":
            return _fork(args)
        case "snapshot":
            return _snapshot(args)
        case "snapshots":
            return _snapshots(args)
        case "snapshot-delete":
            return _snapshot_delete(args)
        case "delete":
            return _delete(args)
    raise ConfigError(f"unknown session command {args.session_command!r}")


def _states(home: Path) -> StateStore:
    return StateStore(bulk_dir(home) / "states")


def _live(home: Path, session_id: str) -> bool:
    entry = registry.read(home, session_id)
    return entry is not None and entry.alive()


def _emit(args: argparse.Namespace, doc: dict[str, object], line: str) -> int:
    print(json.dumps(doc) if args.json else line)
    return 0


def _pause(args: argparse.Namespace) -> int:
    home, sid = home_of(args), registry.check_id(args.id)
    message = {"op": "pause", "mode": args.mode, "by": default_approver()}
    state = _save(home, sid, message)
    return print_saved(args, f"paused session {sid}", sid, state)


def _resume(args: argparse.Namespace) -> int:
    home, sid = home_of(args), registry.check_id(args.id)
    registry.sweep(home)
    if _live(home, sid):
        raise ConfigError(f"session {sid} is live, not paused; nothing to resume")
    paused = server.paused_state(home, sid)
    if paused is None:
        raise StateNotFound(f"no paused session {sid}; see `sandcell session list`")
    registry.socket_path(home, sid)  # a too-long path is refused before starting
    serve = ["--home", str(home), "session", "serve", "--id", sid]
    server.start_server([*serve, "--resume", "--by", default_approver()])
    return _emit(args, {"id": sid, "state": paused.summary()}, sid)


def _fork(args: argparse.Namespace) -> int:
    saving.check_forks(args.n)
    home, sid = home_of(args), registry.check_id(args.id)
    registry.sweep(home)
    started_at = utc_now()
    states = _states(home)
    if _live(home, sid):
        message = {"op": "fork_point", "mode": args.mode}
        point = _save(home, sid, message)
        state = states.get(str(point["id"]), owner=None)
        drop = True
    else:
        paused = server.paused_state(home, sid)
        if paused is None:
            raise SessionEnded(server.not_live(home, sid))
        if args.mode is not None and args.mode != paused.saved.mode.value:
            raise ConfigError(
                f"session {sid} was paused with its {paused.saved.mode.value}; its copies come "
                f"back with that, not with --mode {args.mode}"
            )
        state, drop = paused, False
    try:
        children = _start_copies(home, state, sid, args.n)
        _record_fork(home, state, children, sid, started_at)
    finally:
        if drop:
            with contextlib.suppress(SandcellError):
                states.delete(state.id, owner=None)
    return print_forks(args, sid, children)


def print_forks(args: argparse.Namespace, parent: str, children: list[str]) -> int:
    """Print the copies' ids, one a line (as ``session start`` prints one)."""
    return _emit(args, {"parent": parent, "children": children}, "\n".join(children))


def print_saved(args: argparse.Namespace, what: str, sid: str, state: dict[str, object]) -> int:
    """Print a state just saved (``what``: ``paused session ID``, ``snapshot NAME of ...``)."""
    return _emit(args, {"id": sid, "state": state}, state_line(what, state))


def _start_copies(home: Path, state: StoredState, parent: str, n: int) -> list[str]:
    """``n`` servers, each holding a copy restored from ``state``: all of them, or none (those
    that started are closed and the first error is raised)."""
    ids = [new_session_id() for _ in range(n)]
    serve = ["--home", str(home), "session", "serve"]
    by = default_approver()

    def start(child: str) -> None:
        server.start_server(
            [*serve, "--id", child, "--fork-from", state.id, "--parent", parent, "--by", by]
        )

    with ThreadPoolExecutor(max_workers=min(n, _PARALLEL_STARTS)) as pool:
        futures = [pool.submit(start, child) for child in ids]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for child, future in zip(ids, futures, strict=True):
            if future.exception() is None:
                with contextlib.suppress(SandcellError):
                    server.request(home, child, {"op": "close", "exports": []}, timeout_s=120)
        first = errors[0]
        assert first is not None
        raise first
    return ids


def _record_fork(
    home: Path, state: StoredState, children: list[str], parent: str, started_at: str
) -> None:
    from sandcell.executor import Executor

    settings = state.settings
    with Executor(home=home, profile=settings.profile, backend=state.saved.backend) as ex:
        saving.record_fork(
            ex, state, children, parent, started_at=started_at, by=default_approver()
        )


def _snapshot(args: argparse.Namespace) -> int:
    home, sid = home_of(args), registry.check_id(args.id)
    if args.ttl is not None and not args.ttl > 0:
        raise ConfigError(f"--ttl must be a positive number of seconds, got {args.ttl:g}")
    message = {
        "op": "snapshot",
        "name": args.name,
        "mode": args.mode,
        "ttl_s": args.ttl,
        "by": default_approver(),
    }
    state = _save(home, sid, message)
    return print_saved(args, f"snapshot {args.name} of session {sid}", sid, state)


def _snapshots(args: argparse.Namespace) -> int:
    rows = [s.summary() for s in _states(home_of(args)).list(owner=None, kind="snapshot")]
    return print_snapshots(args, rows)


def print_snapshots(args: argparse.Namespace, rows: list[dict[str, object]]) -> int:
    """Print snapshots (their summaries) as ``session snapshots`` does."""
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no snapshots")
        return 0
    from sandcell.cli.session_render import expiry

    width = max(10, *(len(str(r["name"])) + 2 for r in rows))
    print(
        f"{'NAME':<{width}}{'SESSION':<18}{'BACKEND':<12}{'MODE':<8}{'SIZE':>10}  "
        f"{'EXPIRES':<19}CREATED"
    )
    for r in rows:
        print(
            f"{r['name']!s:<{width}}{r['session_id']!s:<18}{r['backend']!s:<12}"
            f"{r['mode']!s:<8}{size(r['stored_bytes']):>10}  {expiry(r['expires_at']):<19}"
            f"{r['created_at']}"
        )
    return 0


def _snapshot_delete(args: argparse.Namespace) -> int:
    states = _states(home_of(args))
    found = states.find_snapshot(args.name, owner=None)
    gone = states.delete(found.id, owner=None)
    return print_deleted(args, f"snapshot {args.name}", gone.summary())


def print_deleted(args: argparse.Namespace, what: str, state: dict[str, object]) -> int:
    """Print a deleted state (its summary) as ``snapshot-delete`` and ``delete`` do."""
    line = f"deleted {what} ({size(state.get('stored_bytes'))})"
    return _emit(args, {"deleted": state}, line)


def _delete(args: argparse.Namespace) -> int:
    home, sid = home_of(args), registry.check_id(args.id)
    if _live(home, sid):
        raise ConfigError(
            f"session {sid} is live: end it with `sandcell session close {sid}` (delete is for "
            "a paused one)"
        )
    paused = server.paused_state(home, sid)
    if paused is None:
        raise StateNotFound(f"no paused session {sid}; see `sandcell session list`")
    gone = _states(home).delete(sid, owner=None)
    return print_deleted(args, f"paused session {sid}", gone.summary())


def paused_rows(home: Path) -> list[dict[str, object]]:
    """This user's paused sessions as rows of ``session list``."""
    return [paused_row(s.summary()) for s in _states(home).list(owner=None, kind="paused")]


def paused_row(state: dict[str, object]) -> dict[str, object]:
    """A paused session's state summary as a row of ``session list`` (``created_at``: when it
    was paused)."""
    return {
        "id": state["session_id"],
        "state": "paused",
        "pid": None,
        "profile": state["profile"],
        "backend": state["backend"],
        "created_at": state["created_at"],
        "idle_timeout_s": None,
        "max_lifetime_s": None,
        "cells": state["cells"],
        "mode": state["mode"],
        "stored_bytes": state["stored_bytes"],
        "expires_at": state["expires_at"],
    }


def _save(home: Path, sid: str, message: dict[str, object]) -> dict[str, object]:
    """The state the session's server saved on ``message`` (a save may take minutes)."""
    state = checked(server.request(home, sid, message, timeout_s=_SAVE_TIMEOUT_S)).get("state")
    if not isinstance(state, dict):
        raise ConfigError("the session server's reply names no saved state")
    return state


__all__ = [
    "add_parsers",
    "handle_states",
    "paused_row",
    "paused_rows",
    "print_deleted",
    "print_forks",
    "print_saved",
    "print_snapshots",
]
