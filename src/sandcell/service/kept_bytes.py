"""How many bytes a submission may leave stored for its tenant, and a held run keeps.

Counted against the tenant's ``max_stored_bytes`` (:mod:`sandcell.service.quotas`): a run's
stdin, kept in the artifact store under its sha256 with its record (so that it can be replayed);
and a run held for approval, whose whole request (stdin included) stays in the approval store
and whose uploaded input files stay in the service's home until it is decided; and the
tenant's saved session states (paused sessions and snapshots, and a fork's state while its
copies start), which live in the executor's state store, owned by the tenant's id.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.backends.cell.state import PauseMode
from sandcell.policy.approvals import Ticket, request_to_dict
from sandcell.spec import RunRequest

if TYPE_CHECKING:
    from sandcell.executor import Executor
    from sandcell.sessions import Session

__all__ = ["held_bytes", "kept_stdin", "save_estimate", "state_bytes", "submission_bytes"]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # gone already: it keeps nothing


def submission_bytes(request: RunRequest) -> int:
    """What ``request`` may leave stored: its stdin and its input files (kept while it waits
    for approval, if it is held)."""
    return len(request.stdin) + sum(_file_size(i.host_path) for i in request.inputs)


def kept_stdin(request: RunRequest) -> tuple[str, int] | None:
    """``(sha256, size)`` of the stdin a run of ``request`` keeps; None without stdin."""
    if not request.stdin:
        return None
    return hashlib.sha256(request.stdin).hexdigest(), len(request.stdin)


def held_bytes(ticket: Ticket) -> int:
    """What a run held for approval keeps: its stored request and its uploaded inputs."""
    stored = json.dumps(request_to_dict(ticket.request), separators=(",", ":"))
    return len(stored.encode()) + sum(_file_size(i.host_path) for i in ticket.request.inputs)


def state_bytes(executor: Executor, tenant: str) -> int:
    """Disk the tenant's saved session states hold (expired ones are swept first)."""
    return executor.states.stored_bytes(owner=tenant)


def save_estimate(session: Session, mode: PauseMode) -> int:
    """What saving ``session`` in ``mode`` may add, before it is saved (a pause cannot be taken
    back once its sandbox ended): its workspace's bytes, and its memory in ``memory`` mode, as
    its sample taken now says. An estimate: a rung's image may be smaller (compressed) or
    larger."""
    samples = session.metrics(fresh=True)
    if not samples:
        return 0
    last = samples[-1]
    return last.disk_used_bytes + (last.mem_used_bytes if mode is PauseMode.MEMORY else 0)
