"""How a session's state is saved and brought back: the steps :class:`~sandcell.sessions.Session`
and :class:`~sandcell.executor.Executor` share for pause, snapshot, fork and resume.

The rung saves (:meth:`~sandcell.backends.cell.CellSandbox.save`) into a staging directory of the
home's :class:`~sandcell.sessions.states.StateStore`, which hashes, signs and commits it; every
step that changes what a session is becomes an entry of the audit chain
(:mod:`sandcell.sessions.events`). A state comes back as a new :class:`Session` opened with the
settings kept in it (its profile admits them again, so a profile that tightened since refuses
the resume rather than running it under old limits) and its rung restoring the state.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.backends.cell.kernel import memory_refusal
from sandcell.backends.cell.state import PauseMode, PauseRefused
from sandcell.errors import ConfigError, InfraError
from sandcell.home import SHARED_DIR_ENV
from sandcell.policy.profiles import Profile
from sandcell.sessions.events import Event, record_event
from sandcell.sessions.states import StateKind, StoredState
from sandcell.spec import InputFile, IsolationMode, Limits, language_named

if TYPE_CHECKING:
    from sandcell.audit import AuditEntry
    from sandcell.executor import Executor
    from sandcell.sessions.session import Session

log = logging.getLogger("sandcell.sessions")

EventListener = Callable[[str | None, "AuditEntry"], None]
"""Told ``(owner, entry)`` after each session event is in the chain."""

_LISTENERS: weakref.WeakKeyDictionary[Executor, list[EventListener]] = weakref.WeakKeyDictionary()

MAX_FORKS = 20
FORK_STATE_TTL_S = 3600.0
"""A fork's state is removed once its copies started; this bounds it if the process died."""


def on_event(executor: Executor, listener: EventListener) -> None:
    """Call ``listener(owner, entry)`` after every session event of ``executor``'s sessions is
    recorded (``owner``: the state's). A listener that fails is logged; the event stands."""
    _LISTENERS.setdefault(executor, []).append(listener)


def _event(executor: Executor, owner: str | None, event: Event, **fields: Any) -> AuditEntry:
    entry = record_event(executor, event, **fields)
    tell_listeners(executor, owner, entry)
    return entry


def tell_listeners(executor: Executor, owner: str | None, entry: AuditEntry) -> None:
    """Tell the :func:`on_event` listeners of ``executor`` about ``entry`` (a session's entry
    of the chain that is no run: an event, or its port connections after the last cell)."""
    for listener in list(_LISTENERS.get(executor, ())):
        try:
            listener(owner, entry)
        except Exception:
            log.exception("a listener of session entry %s failed", entry.run_id)


def check_forks(n: int) -> None:
    if not isinstance(n, int) or not 1 <= n <= MAX_FORKS:
        raise ConfigError(f"a session forks into 1 to {MAX_FORKS} copies, not {n!r}")


def save(
    session: Session,
    *,
    kind: StateKind,
    mode: PauseMode,
    keep_running: bool,
    state_id: str,
    name: str | None = None,
    ttl_s: float | None = None,
    end_as: str | None = None,
) -> StoredState:
    """Save ``session``'s sandbox (its lock held by the caller) and commit the state. A mode the
    rung refuses changes nothing; a failed save that stops the sandbox ends the session. With
    ``end_as`` (a pause), the session ends with that reason once its sandbox saved itself and
    before the state is committed: a state is listed only once nothing of its sandbox is left,
    so a resume, from this process or another, never starts in the old sandbox's place."""
    sandbox = session._sandbox
    if not sandbox.pause_modes:
        # Every rung saves files; only a sandbox on a cluster node that cannot reach this
        # process's state directory offers nothing (cluster/remote_cell.py).
        raise PauseRefused(
            f"session {session.id}'s sandbox offers no pause mode here: it is on a cluster node "
            f"that does not see this replica's state directory; set ${SHARED_DIR_ENV} to a "
            "directory every node and replica mounts at the same path"
        )
    if mode not in sandbox.pause_modes:
        offered = ", ".join(sorted(m.value for m in sandbox.pause_modes))
        # A Node kernel's memory is refused on every rung: say why rather than the rung.
        why = memory_refusal(session.request.language) if mode is PauseMode.MEMORY else None
        raise PauseRefused(
            why
            or f"the {sandbox.backend.name} backend cannot save a session's {mode.value} here; "
            f"it offers: {offered}"
        )
    states = session.executor.states
    staging = states.staging()
    try:
        saved = sandbox.save(staging / "data", mode=mode, keep_running=keep_running)
        if end_as is not None:
            session._end(end_as)
        return states.commit(
            staging,
            kind=kind,
            state_id=state_id,
            name=name,
            owner=session.owner,
            session_id=session.id,
            cells=session.cells,
            settings=session.settings(),
            saved=saved,
            labels=session.labels,
            ttl_s=session.paused_ttl_s
            if kind == "paused"
            else FORK_STATE_TTL_S
            if kind == "fork"
            else ttl_s,
        )
    except PauseRefused:
        states.discard(staging)
        raise
    except BaseException as exc:
        states.discard(staging)
        if (not keep_running or sandbox.ended is not None) and session.ended is None:
            session._end(f"its state could not be saved ({exc})")
        raise


def record(
    session: Session, event: Event, state: StoredState, *, started_at: str, by: str | None
) -> StoredState:
    """The event in the chain, and the state with the entry's id kept in its manifest."""
    entry = _event(
        session.executor,
        state.owner,
        event,
        session_id=session.id,
        profile=session.profile.name,
        backend=state.saved.backend,
        state=state,
        started_at=started_at,
        by=by,
        parent_session_id=session.parent,
    )
    return session.executor.states.set_record(state, entry.run_id)


def open_from(
    executor: Executor,
    state: StoredState,
    *,
    session_id: str | None,
    parent: str | None,
    profile: Profile | str | None = None,
) -> Session:
    """A live session brought back from ``state`` (checked by the caller): its settings
    admitted again under its profile, its rung restoring what it saved. ``profile`` names that
    profile (it must be the one the state was saved under) or is it, for a profile that is not
    found by name (one parsed by the caller): without it, the profile is loaded by name."""
    from sandcell.sessions.session import Session

    s = state.settings
    name = profile.name if isinstance(profile, Profile) else profile
    if name is not None and name != s.profile:
        raise ConfigError(
            f"the state was saved under profile {s.profile!r}; a session started from it runs "
            f"under that profile, not {name!r}"
        )
    return Session(
        executor,
        profile=profile if isinstance(profile, Profile) else s.profile,
        limits=Limits(**s.limits),
        inputs=[InputFile(host_path=_path(p), name=n) for p, n in s.inputs],
        mode=IsolationMode(s.mode),
        landlock=s.landlock,
        idle_timeout_s=s.idle_timeout_s,
        max_lifetime_s=s.max_lifetime_s,
        runtime=s.runtime,
        language=language_named(s.language),
        on_idle="pause" if s.on_idle == "pause" else "end",
        paused_ttl_s=s.paused_ttl_s,
        owner=state.owner,
        session_id=session_id,
        restore=state,
        parent=parent,
        labels=state.labels,
    )


def _path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise ConfigError(
            f"the session's input {path} is gone from the host, so the session cannot come back "
            "with its inputs; put the file back at that path to resume it"
        )
    return path


def open_forks(
    executor: Executor,
    state: StoredState,
    n: int,
    *,
    started_at: str,
    by: str | None,
    parent: Session | None,
    profile: Profile | str | None = None,
) -> list[Session]:
    """``n`` sessions restored from ``state`` at once, each with an id of its own; all or none:
    when one fails, those already open are closed and the first error is raised. One ``fork``
    event names the parent and every copy."""
    parent_id = parent.id if parent is not None else state.session_id
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandcell-fork") as pool:
        futures = [
            pool.submit(
                open_from,
                executor,
                state,
                session_id=None,
                parent=parent_id,
                profile=parent.profile if parent is not None else profile,
            )
            for _ in range(n)
        ]
    forks: list[Session] = []
    errors: list[BaseException] = []
    for future in futures:
        exc = future.exception()
        if exc is None:
            forks.append(future.result())
        else:
            errors.append(exc)
    if errors:
        for fork in forks:
            with contextlib.suppress(Exception):
                fork.close()
        raise errors[0]
    record_fork(executor, state, [f.id for f in forks], parent_id, started_at=started_at, by=by)
    return forks


def record_fork(
    executor: Executor,
    state: StoredState,
    children: list[str],
    parent_id: str,
    *,
    started_at: str,
    by: str | None,
) -> None:
    """The one ``fork`` event of the copies ``children`` of ``parent_id`` restored from
    ``state``, once all of them started (also for a caller that opened each copy in a process
    of its own: the CLI's session servers)."""
    _event(
        executor,
        state.owner,
        "fork",
        session_id=parent_id,
        profile=state.settings.profile,
        backend=state.saved.backend,
        state=state,
        started_at=started_at,
        by=by,
        children=children,
    )


def drop(executor: Executor, state: StoredState) -> None:
    """Remove a fork's state once its copies started from it (or failed to)."""
    with contextlib.suppress(ConfigError, InfraError):
        executor.states.delete(state.id, owner=state.owner)


def resume(
    executor: Executor,
    session_id: str,
    *,
    owner: str | None,
    by: str | None,
    profile: Profile | str | None = None,
) -> Session:
    """The paused session ``session_id`` live again, under its id; its paused state is
    consumed (claimed first, so a second resume at the same time finds nothing, and put back
    when the restore fails)."""
    from sandcell.audit.record import utc_now

    started_at = utc_now()
    state = executor.states.claim(session_id, owner=owner)
    if state.kind != "paused":
        executor.states.release(state)
        raise ConfigError(f"{session_id} is a {state.kind}, not a paused session")
    try:
        session = open_from(
            executor, state, session_id=state.session_id, parent=None, profile=profile
        )
    except BaseException:
        executor.states.release(state)
        raise
    try:
        record(session, "resume", state, started_at=started_at, by=by)
    except BaseException:
        session.close()
        executor.states.release(state)
        raise
    executor.states.drop_claimed(state)
    return session


def start_from_snapshot(
    executor: Executor,
    name: str,
    *,
    owner: str | None,
    profile: Profile | str | None,
    by: str | None,
    session_id: str | None = None,
) -> Session:
    """A new session (an id of its own: ``session_id``, else a fresh one) started from the
    snapshot ``name``."""
    from sandcell.audit.record import utc_now

    started_at = utc_now()
    found = executor.states.find_snapshot(name, owner=owner)
    state = executor.states.load(found.id, owner=owner)
    session = open_from(
        executor, state, session_id=session_id, parent=state.session_id, profile=profile
    )
    try:
        _event(
            executor,
            state.owner,
            "start_from_snapshot",
            session_id=session.id,
            profile=session.profile.name,
            backend=state.saved.backend,
            state=state,
            started_at=started_at,
            by=by,
            parent_session_id=state.session_id,
        )
    except BaseException:
        session.close()
        raise
    return session


__all__ = [
    "FORK_STATE_TTL_S",
    "MAX_FORKS",
    "EventListener",
    "check_forks",
    "drop",
    "on_event",
    "open_forks",
    "record_fork",
    "save",
    "tell_listeners",
]
