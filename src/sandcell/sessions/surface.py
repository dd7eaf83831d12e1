"""The executor's calls on sessions: open one (fresh or from a snapshot), resume a paused one,
fork a paused one, list and delete paused sessions and snapshots.

A mixin of :class:`~sandcell.executor.Executor`, which keeps its own surface thin, over
:mod:`sandcell.sessions.saving` and the home's :class:`~sandcell.sessions.states.StateStore`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from sandcell.errors import ConfigError
from sandcell.sessions import saving
from sandcell.sessions.session import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    DEFAULT_PAUSED_TTL_S,
    OnIdle,
    Session,
)
from sandcell.sessions.states import StateNotFound, StateStore, StoredState
from sandcell.spec import InputFile, IsolationMode, Language, Limits

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.policy.profiles import Profile


class SessionCalls:
    """Sessions, as :class:`~sandcell.executor.Executor` offers them."""

    states: StateStore

    if TYPE_CHECKING:

        def check_home(self) -> None: ...

        @staticmethod
        def _profile(profile: Profile | str) -> Profile: ...

    def _executor(self) -> Executor:
        # Only Executor inherits this mixin.
        return cast("Executor", self)

    def session(
        self,
        *,
        profile: Profile | str | None = None,
        limits: Limits | None = None,
        inputs: Sequence[InputFile] = (),
        mode: IsolationMode = IsolationMode.STRICT,
        landlock: bool | None = None,
        idle_timeout_s: float | None = None,
        max_lifetime_s: float | None = None,
        runtime: str | None = None,
        on_idle: OnIdle = "end",
        paused_ttl_s: float | None = None,
        snapshot: str | None = None,
        owner: str | None = None,
        by: str | None = None,
        language: Language = "python",
    ) -> Session:
        """Start a session: one sandbox kept alive across cells (see :mod:`sandcell.sessions`).

        Each cell is checked under ``profile`` and recorded as a run with the session's id;
        ``runtime`` (None: the profile's) is the session's for all its cells. ``on_idle="pause"``
        pauses the session at its idle timeout or lifetime instead of ending it (see
        :meth:`Session.pause <sandcell.sessions.Session.pause>`); a paused state is kept
        ``paused_ttl_s``. ``snapshot`` starts the session from that snapshot of ``owner``'s
        (:meth:`Session.snapshot <sandcell.sessions.Session.snapshot>`): its profile, limits and
        state are the snapshot's, so no other settings may be given with it. ``language`` is the
        kernel's: ``python``, or ``javascript`` / ``typescript`` for a Node kernel (the node
        runtime); Bash cells run in a Python session.
        """
        self.check_home()
        if snapshot is not None:
            given = (limits, inputs, landlock, idle_timeout_s, max_lifetime_s, runtime)
            unset = paused_ttl_s is None and language == "python"
            if any(g not in (None, ()) for g in given) or not unset:
                raise ConfigError(
                    "a session started from a snapshot takes the snapshot's settings; give only "
                    "snapshot= (and profile= naming the snapshot's profile, if at all)"
                )
            return saving.start_from_snapshot(
                self._executor(),
                snapshot,
                owner=owner,
                profile=profile,
                by=by,
            )
        return Session(
            self._executor(),
            profile=profile,
            limits=limits,
            inputs=inputs,
            mode=mode,
            landlock=landlock,
            idle_timeout_s=idle_timeout_s or DEFAULT_IDLE_TIMEOUT_S,
            max_lifetime_s=max_lifetime_s or DEFAULT_MAX_LIFETIME_S,
            runtime=runtime,
            on_idle=on_idle,
            paused_ttl_s=paused_ttl_s or DEFAULT_PAUSED_TTL_S,
            owner=owner,
            language=language,
        )

    def resume(
        self,
        session_id: str,
        *,
        owner: str | None = None,
        by: str | None = None,
        profile: Profile | None = None,
    ) -> Session:
        """Bring the paused session ``session_id`` back, live, under its id, profile and limits
        (also after this process or the host restarted). The profile is loaded by its name;
        give ``profile`` for one that is not found by name (a profile the caller parsed),
        which must have the name the session was paused under. Raises
        :class:`~sandcell.sessions.states.StateNotFound` when ``owner`` has no such paused
        session, :class:`~sandcell.sessions.states.StateTampered` when its saved state changed
        on disk (it is never loaded)."""
        self.check_home()
        return saving.resume(self._executor(), session_id, owner=owner, by=by, profile=profile)

    def fork_paused(
        self,
        session_id: str,
        n: int = 1,
        *,
        owner: str | None = None,
        by: str | None = None,
        profile: Profile | None = None,
    ) -> list[Session]:
        """``n`` new live sessions copied from the paused session ``session_id``, which stays
        paused (see :meth:`Session.fork <sandcell.sessions.Session.fork>`; ``profile`` as for
        :meth:`resume`)."""
        from sandcell.audit.record import utc_now

        saving.check_forks(n)
        self.check_home()
        started_at = utc_now()
        state = self.states.load(session_id, owner=owner)
        if state.kind != "paused":
            raise ConfigError(f"{session_id} is a {state.kind}, not a paused session")
        return saving.open_forks(
            self._executor(), state, n, started_at=started_at, by=by, parent=None, profile=profile
        )

    def paused(self, *, owner: str | None = None) -> list[StoredState]:
        """``owner``'s paused sessions, oldest first (expired ones are swept first)."""
        return self.states.list(owner=owner, kind="paused")

    def snapshots(self, *, owner: str | None = None) -> list[StoredState]:
        """``owner``'s snapshots, oldest first."""
        return self.states.list(owner=owner, kind="snapshot")

    def delete_paused(self, session_id: str, *, owner: str | None = None) -> StoredState:
        """Forget a paused session for good."""
        state = self.states.get(session_id, owner=owner)
        if state.kind != "paused":
            raise StateNotFound(f"no paused session {session_id}")
        return self.states.delete(session_id, owner=owner)

    def delete_snapshot(self, name: str, *, owner: str | None = None) -> StoredState:
        """Forget a snapshot; sessions started from it go on."""
        state = self.states.find_snapshot(name, owner=owner)
        return self.states.delete(state.id, owner=owner)


__all__ = ["SessionCalls"]
