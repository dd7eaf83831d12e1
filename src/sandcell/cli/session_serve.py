"""``sandcell session serve`` (internal): what a detached session server opens.

``session start`` asks for a new session (or, with ``--snapshot``, one started from a snapshot);
``session resume`` for the paused session under its own id (``--resume``); ``session fork`` for
one copy per server, restored from a fork point or a paused state (``--fork-from``). A session
brought back from a state runs on the rung that saved it and under the profile kept in it (read
from its signed manifest here, checked whole again when it is opened), so the server's executor
is built for those. The server itself is :func:`sandcell.sessions.server.serve`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.cli.session import _session_limits, home_of, idle_timeout, max_lifetime
from sandcell.errors import ConfigError, SandcellError
from sandcell.home import bulk_dir
from sandcell.sessions import DEFAULT_PAUSED_TTL_S, Session, registry, saving, server
from sandcell.sessions.states import StateNotFound, StateStore, StoredState
from sandcell.spec import IsolationMode, input_from_path

if TYPE_CHECKING:
    from sandcell.executor import Executor


def serve(args: argparse.Namespace) -> int:
    from sandcell.executor import Executor

    home = home_of(args)
    try:
        session_id = registry.check_id(args.id)
        state, open_session = _opening(args, home, session_id)
    except SandcellError as exc:
        # Said on the ready descriptor, as the server says its own refusals: the starting
        # command prints it (a state gone, tampered with, or of another kind).
        os.write(args.ready_fd, f"error {exc}\n".encode())
        return 1
    profile = args.profile if state is None else (args.profile or state.settings.profile)
    backend = args.backend if state is None else state.saved.backend
    return server.serve(
        home=home,
        session_id=session_id,
        open_executor=lambda: Executor(home=home, profile=profile, backend=backend),
        open_session=open_session,
        ready_fd=args.ready_fd,
    )


def _opening(
    args: argparse.Namespace, home: Path, session_id: str
) -> tuple[StoredState | None, Callable[[Executor], Session]]:
    """The state the session comes back from (None for a new one) and how to open it."""
    states = StateStore(bulk_dir(home) / "states")
    by = args.by
    if args.resume:
        paused = server.paused_state(home, session_id)
        if paused is None:
            raise StateNotFound(f"no paused session {session_id}; see `sandcell session list`")
        return paused, lambda ex: ex.resume(session_id, by=by)
    if args.fork_from is not None:
        point = states.get(registry.check_id(args.fork_from), owner=None)
        if point.kind == "snapshot":
            raise ConfigError("a session starts from a snapshot with --snapshot, not as a fork")
        parent = registry.check_id(args.parent) if args.parent else point.session_id
        return point, lambda ex: saving.open_from(
            ex, ex.states.load(point.id, owner=None), session_id=session_id, parent=parent
        )
    if args.snapshot is not None:
        snapshot = states.find_snapshot(args.snapshot, owner=None)
        name = args.snapshot

        def from_snapshot(ex: Executor) -> Session:
            return saving.start_from_snapshot(
                ex,
                name,
                owner=None,
                profile=ex.profile.name if args.profile else None,
                by=by,
                session_id=session_id,
            )

        return snapshot, from_snapshot
    return None, lambda ex: _new(ex, args, session_id)


def _new(ex: Executor, args: argparse.Namespace, session_id: str) -> Session:
    return Session(
        ex,
        limits=_session_limits(args),
        inputs=tuple(input_from_path(p) for p in args.input),
        mode=IsolationMode(args.isolation),
        landlock=False if args.no_landlock else None,
        idle_timeout_s=idle_timeout(args),
        max_lifetime_s=max_lifetime(args),
        session_id=session_id,
        on_idle="pause" if args.on_idle == "pause" else "end",
        paused_ttl_s=DEFAULT_PAUSED_TTL_S if args.paused_ttl is None else args.paused_ttl,
        language=args.lang,
    )


__all__ = ["serve"]
