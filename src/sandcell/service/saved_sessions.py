"""The service's side of sessions that last: what it holds for a tenant's paused sessions,
snapshots and forks beyond what the executor's state store keeps.

* Each session event in the audit chain (pause, resume, snapshot, fork, start from a snapshot)
  becomes the owning tenant's record (:func:`event_listener`, told by
  :func:`sandcell.sessions.saving.on_event`), as a cell's run is, so ``/v1/audit`` shows it to
  that tenant and to no other; an idle session that pauses itself is covered too.
* A session's uploaded inputs (``<home>/service/inputs/session-*``) are the host files its
  saved states name: a resume, a fork or a start from a snapshot reads them again. The folder
  stays while a live session or a saved state of the tenant names a file in it
  (:func:`inputs_in_use`) and goes with the last of them.
* A pause, snapshot or fork is refused before it saves when its estimated size would take the
  tenant over ``max_stored_bytes`` (:func:`check_room`); a fork and a resume take a sandbox slot
  per session they open (:func:`take_slots`).
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.cell.state import PauseMode
from sandcell.errors import SandcellError
from sandcell.service.kept_bytes import save_estimate
from sandcell.service.problems import ServiceProblem
from sandcell.service.tenants import Tenant

if TYPE_CHECKING:
    from sandcell.audit import AuditEntry
    from sandcell.service.core import LiveSession, Service
    from sandcell.sessions import Session
    from sandcell.sessions.saving import EventListener
    from sandcell.sessions.states import StoredState

__all__ = [
    "check_profile",
    "check_room",
    "drop_inputs",
    "event_listener",
    "hold",
    "inputs_dir",
    "inputs_in_use",
    "open_sessions",
    "take_slots",
]


def event_listener(service: Service) -> EventListener:
    """The listener that maps a session event's entry to the tenant owning its state (owner
    None: a local user's session, no tenant's). It holds the service weakly: the listener
    lives as long as the executor, which the service holds."""
    ref = weakref.ref(service)

    def own_event(owner: str | None, entry: AuditEntry) -> None:
        found = ref()
        if owner is not None and found is not None:
            found.tenants.own(owner, "run", [entry.run_id])

    return own_event


def _folder(service: Service, host_paths: Iterable[str]) -> Path | None:
    """The service's inputs folder the paths lie in (None: not one of the service's)."""
    root = service.inputs_root.resolve()
    for text in host_paths:
        folder = Path(text).parent
        if folder.resolve().parent == root:
            return folder
    return None


def inputs_dir(service: Service, session: Session) -> Path | None:
    """The inputs folder of a session brought back from a state (None: it has no uploaded
    inputs)."""
    return _folder(service, (str(i.host_path) for i in session.request.inputs))


def inputs_in_use(service: Service, tenant: str, folder: Path) -> bool:
    """Whether a live session of the service or a saved state of ``tenant`` names a file in
    ``folder``."""
    with service._sessions_lock:
        if any(live.inputs_dir == folder for live in service.sessions.values()):
            return True
    try:
        states = service.executor.states.list(owner=tenant)
    except SandcellError:
        return True  # cannot tell: keep the files (a resume without them fails)
    return any(_folder(service, (p for p, _ in s.settings.inputs)) == folder for s in states)


def drop_inputs(service: Service, tenant: str, state: StoredState) -> None:
    """After ``state`` was deleted: remove its inputs folder if nothing else names it."""
    folder = _folder(service, (p for p, _ in state.settings.inputs))
    if folder is not None and not inputs_in_use(service, tenant, folder):
        shutil.rmtree(folder, ignore_errors=True)


def check_profile(tenant: Tenant, state: StoredState) -> None:
    """A saved state comes back under its profile: refused when the tenant may no longer use
    it (the operator took it away since)."""
    if state.settings.profile not in tenant.profiles:
        raise ServiceProblem(
            403,
            f"the saved state runs under profile {state.settings.profile!r}, which is no longer "
            f"one of tenant {tenant.name!r}'s profiles ({', '.join(tenant.profiles)})",
        )


def check_room(service: Service, tenant: Tenant, session: Session, mode: PauseMode) -> None:
    """Raise the stored-bytes 429 when saving ``session`` in ``mode`` would go over."""
    service.quotas.check_stored(tenant, save_estimate(session, mode))


def take_slots(service: Service, tenant: Tenant, n: int) -> None:
    """Admit ``n`` sessions at once (a sandbox slot each), or none: 429 with nothing held.
    Every slot taken is given back by :meth:`Service.end_session` of its session, or by the
    caller when the session did not open."""
    taken = 0
    try:
        for _ in range(n):
            service.admit(tenant, sandbox=True)
            taken += 1
    except BaseException:
        for _ in range(taken):
            service.quotas.release(tenant.id)
        raise


async def open_sessions(
    service: Service, tenant: Tenant, opener: Callable[[], Sequence[Session]], *, count: int = 1
) -> list[Session]:
    """``count`` sessions opened by ``opener`` on a session thread, each holding one of the
    tenant's sandbox slots (429 over ``max_concurrent``, and nothing opened); the slots are
    given back when they do not open."""
    take_slots(service, tenant, count)
    try:
        sessions = await service.in_thread(opener, session=True)
    except BaseException:
        for _ in range(count):
            service.quotas.release(tenant.id)
        raise
    return list(sessions)


def hold(service: Service, tenant: Tenant, session: Session) -> LiveSession:
    """Hold a session the service opened from a saved state, as ``POST /v1/sessions`` does one
    it opened fresh (its slot already taken)."""
    from sandcell.service.core import LiveSession

    live = LiveSession(
        tenant=tenant.id,
        session=session,
        inputs_dir=inputs_dir(service, session),
        key_sha256=tenant.key_sha256,
    )
    service.add_session(live)
    return live
