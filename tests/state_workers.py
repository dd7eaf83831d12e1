"""Bodies of the child processes of tests/unit/test_states_shared.py: replicas on one database
(``$SANDCELL_DATABASE_URL``) and one shared directory (``$SANDCELL_SHARED_DIR``), both
inherited, each with a home of its own.

A module of their own so that a spawned child imports only the state store, not the test
module's imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Barrier(Protocol):
    def wait(self, timeout: float | None = ...) -> int: ...


def claim_once(home: str, state_id: str, owner: str, out: str, barrier: Barrier) -> None:
    """Open the home's state store, then claim ``state_id`` at the same moment as the other
    workers; write ``won`` or ``lost`` to ``out``. A winner keeps its claim (it exits as a
    resume that died would)."""
    from sandcell.home import bulk_dir
    from sandcell.sessions.states import StateNotFound, StateStore

    with StateStore(bulk_dir(Path(home)) / "states") as store:
        store.list(owner=owner)  # connected (and the database checked) before the race
        barrier.wait(timeout=120)
        try:
            store.claim(state_id, owner=owner)
        except StateNotFound:
            Path(out).write_text("lost")
        else:
            Path(out).write_text("won")
