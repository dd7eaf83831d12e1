"""What a sweep hands back of a dead replica (:meth:`ReplicaState.sweep`), on a real PostgreSQL:
each run it left unanswered with the node it was placed on (:meth:`ReplicaState.run_placed`,
noted after the run was noted as begun; None for a run lost before its placement was noted),
and the sessions it had in the directory with their nodes, so that the sweeping replica ends
their sandboxes there (tests/integration/test_cluster_replica_lost.py does it on a cluster)."""

from __future__ import annotations

import time

from sandcell.db.replicas import ReplicaState

_WAIT_S = 60.0


def test_a_sweep_returns_the_dead_replica_s_runs_with_their_nodes_and_its_sessions(
    postgres_url: str,
) -> None:
    dead = ReplicaState(postgres_url, dead_after_s=1.0)
    alive = ReplicaState(postgres_url, dead_after_s=1.0)
    try:
        dead.register()
        dead.run_started("placed", "t", code="print(1)", language="python")
        dead.run_placed("placed", "node-1")
        dead.run_started("queued", "t", code="print(2)", language="python")
        # Only the replica that began a run notes its node.
        alive.run_placed("queued", "node-2")
        dead.place_session("s1", tenant="t", node="node-1", profile="strict")
        dead.place_session("s0", tenant="t", node="node-2", profile="strict")
        alive.place_session("mine", tenant="t", node="node-1", profile="strict")
        deadline = time.monotonic() + _WAIT_S
        while dead.id in alive.live_replicas():
            assert time.monotonic() < deadline, "the replica never looked dead"
            time.sleep(0.1)
        alive.heartbeat()

        swept = alive.sweep()
        assert {(r.run_id, r.node) for r in swept.runs} == {("placed", "node-1"), ("queued", None)}
        assert [(s.session_id, s.node, s.replica) for s in swept.sessions] == [
            ("s0", "node-2", dead.id),
            ("s1", "node-1", dead.id),
        ]
        assert alive.session_place("s1") is None
        assert alive.session_place("mine") is not None
        # Swept once: a second sweep finds nothing of it.
        again = alive.sweep()
        assert (again.runs, again.sessions) == ((), ())
    finally:
        dead.close()
        alive.close()
