"""A tenant's ``max_concurrent`` across replicas (:meth:`ReplicaState.admit`) when a replica's
heartbeat is late, as every replica's is right after a database outage: its holds still count
until a sweep removes it (fail closed). Counting only the replicas that beat recently admitted a
whole quota more while the runs admitted before still ran (bench/soak_cluster.py found it: four
runs at once under a ``max_concurrent`` of three, just after PostgreSQL came back)."""

from __future__ import annotations

import time

from sandcell.db.replicas import ReplicaState

_QUOTA = 2
_WAIT_S = 60.0


def _admit(state: ReplicaState) -> bool:
    return state.admit("t", max_concurrent=_QUOTA, runs_per_minute=600, sandbox=True).admitted


def _late(observer: ReplicaState, late: ReplicaState) -> None:
    """Wait until ``observer`` no longer sees ``late`` beat (it does not beat meanwhile)."""
    deadline = time.monotonic() + _WAIT_S
    while late.id in observer.live_replicas():
        assert time.monotonic() < deadline, "the replica never looked dead"
        time.sleep(0.1)


def test_a_late_replica_s_holds_count_until_it_is_swept(postgres_url: str) -> None:
    a = ReplicaState(postgres_url, dead_after_s=1.0)
    b = ReplicaState(postgres_url, dead_after_s=1.0)
    try:
        a.register()
        b.register()
        assert _admit(a) and _admit(a)
        assert not _admit(b)
        _late(b, a)
        b.heartbeat()
        # A may only be late (the database was away): its runs may still run.
        assert b.holding("t") == _QUOTA
        assert not _admit(b)
        # Once swept (A is dead: what it held is gone), its holds no longer count.
        assert b.sweep().runs == ()
        assert a.id not in b.live_replicas()
        assert b.holding("t") == 0
        assert _admit(b)
    finally:
        a.close()
        b.close()


def test_after_an_outage_a_replica_counts_its_own_late_holds(postgres_url: str) -> None:
    """Right after an outage a replica's own row is late too: its own holds still count."""
    a = ReplicaState(postgres_url, dead_after_s=1.0)
    try:
        a.register()
        assert _admit(a) and _admit(a)
        other = ReplicaState(postgres_url, dead_after_s=1.0)
        try:
            _late(other, a)
        finally:
            other.close()
        assert not _admit(a)
        a.release("t")
        assert _admit(a)
    finally:
        a.close()
