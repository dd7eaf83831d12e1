"""How many bytes a submission may leave stored for its tenant, and a held run keeps.

Counted against the tenant's ``max_stored_bytes`` (:mod:`sandcell.service.quotas`): a run's
stdin, kept in the artifact store under its sha256 with its record (so that it can be replayed);
and a run held for approval, whose whole request (stdin included) stays in the approval store
and whose uploaded input files stay in the service's home until it is decided.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sandcell.policy.approvals import Ticket, request_to_dict
from sandcell.spec import RunRequest

__all__ = ["held_bytes", "kept_stdin", "submission_bytes"]


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
