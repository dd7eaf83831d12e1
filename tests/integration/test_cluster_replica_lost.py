"""A replica on a Ray cluster dies: what it left on the nodes is swept (docs/cluster.md,
"Failures").

Real processes throughout: a local Ray cluster of two ``ray start`` nodes on loopback, a
PostgreSQL, and ``sandcell serve --cluster`` replicas sharing both. The test process watches
the nodes' agents through a :class:`~sandcell.cluster.Cluster` of its own (their reports: runs
running and queued, live sessions).

- A replica killed with a run in flight and a live session: another replica sweeps it, records
  the run lost once, and the node's agent ends the run and the session's sandbox.
- A replica killed with a live session and no replica left to sweep it: the node's agent ends
  the sandbox itself once nobody has touched it for its idle timeout.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'sandcell[ray]'")

from tests.integration.hostscan import all_procs
from tests.pg_server import PostgresServer
from tests.ray_cluster import Cluster, local_cluster
from tests.service.replicas import LONG_RUN, cluster_in, eventually
from tests.service.replicas import Cluster as Shared
from tests.service.server import ServiceProcess

from sandcell.cluster import Cluster as Placement
from sandcell.cluster.cells import IDLE_GRACE_ENV
from sandcell.cluster.wire import NodeReport

pytestmark = pytest.mark.slow

DEAD_AFTER_S = "3"
IDLE_GRACE_S = 1.0
"""The nodes' grace beyond an orphaned session's idle timeout (10 s by default): the test waits
for that clock, and a second still lets the replica's watchdog come first while it lives."""


@dataclass(frozen=True)
class Setup:
    nodes: Cluster
    shared: Shared
    watch: Placement


@pytest.fixture(scope="module")
def setup(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    with (
        local_cluster(
            ("a", "b"), slots=2, prefix="scrl-", env={IDLE_GRACE_ENV: str(IDLE_GRACE_S)}
        ) as nodes,
        cluster_in(postgres_server, tmp_path_factory) as shared,
    ):
        watch = Placement.connect(nodes.address, home=tmp_path_factory.mktemp("watch"))
        try:
            yield Setup(nodes, shared, watch)
        finally:
            watch.close()


def _replica(setup: Setup, home: Path) -> ServiceProcess:
    home.mkdir(parents=True)
    env = {**setup.shared.env, "SANDCELL_REPLICA_DEAD_AFTER_S": DEAD_AFTER_S}
    return ServiceProcess(home, args=("--cluster", setup.nodes.address), env=env).start(timeout=180)


def _reports(setup: Setup) -> list[NodeReport]:
    setup.watch.refresh(wait_s=10)
    return setup.watch.reports()


_SPARE = "read -r _ <&"
"""The command line of a spawner made ahead for the next cold run, waiting for its start
(backends/namespaces/spawner.py): nothing runs in it, it is no run's sandbox yet."""


def _node_procs(setup: Setup) -> list[str]:
    """The live processes below the nodes' agents (each starts its node's sandboxes from its
    own process), spares waiting for a run left out: pid and command line of each."""
    agents = {r.pid for r in _reports(setup)}
    procs = {p.pid: p for p in all_procs() if not p.zombie}
    found = []
    for proc in procs.values():
        up = procs.get(proc.ppid)
        while up is not None and up.pid not in agents:
            up = procs.get(up.ppid)
        if up is not None and _SPARE not in proc.cmdline:
            found.append(f"{proc.pid} {proc.cmdline[:160]}")
    return found


def _no_sandbox_left(setup: Setup) -> None:
    try:
        eventually("the sandboxes' processes to be gone", lambda: not _node_procs(setup) or None)
    except AssertionError:
        raise AssertionError(f"left below the agents: {_node_procs(setup)}") from None


def _record(client: httpx2.Client, run_id: str) -> dict[str, object] | None:
    got = client.get(f"/v1/runs/{run_id}")
    if got.status_code != 200 or got.json()["status"] != "finished":
        return None
    record: dict[str, object] = got.json()["result"]
    return record


def _logged(replica: ServiceProcess, *patterns: str) -> bool | None:
    said = (replica.home / "serve.log").read_text()
    return all(re.search(p, said) for p in patterns) or None


def test_a_dead_replica_s_run_and_session_end_on_their_nodes(setup: Setup, tmp_path: Path) -> None:
    a = _replica(setup, tmp_path / "a")
    b = _replica(setup, tmp_path / "b")
    try:
        key = setup.shared.tenant(a.home, "lost", max_concurrent=4)
        with a.client(key) as ca, b.client(key) as cb:
            got = ca.post("/v1/runs", json=LONG_RUN)
            assert got.status_code == 202, got.text
            run_id = got.json()["id"]
            opened = ca.post("/v1/sessions", json={"idle_timeout_s": 600})
            assert opened.status_code in (200, 201), opened.text
            session_id = opened.json()["id"]
            eventually(
                "the run running and the session live on the nodes",
                lambda: (
                    (
                        sum(r.running for r in _reports(setup)) == 1
                        and sum(r.sessions for r in _reports(setup)) == 1
                    )
                    or None
                ),
            )
            assert _node_procs(setup), "no sandbox process found below the nodes' agents"
            a.stop(signal.SIGKILL)

            record = eventually("B to record the lost run", lambda: _record(cb, run_id))
            assert record["outcome"] == "infra_error", record
            reason = str(record["reason"])
            assert reason.startswith("replica lost") and " on node " in reason, reason
            eventually(
                "the nodes to run nothing and hold no session",
                lambda: (
                    all(
                        r.running == 0 and r.queued == 0 and r.sessions == 0
                        for r in _reports(setup)
                    )
                    or None
                ),
            )
            _no_sandbox_left(setup)
            # Stopped by the sweep's cancel on its node, not by its own time limit. B logs each
            # once the node's call returned, which may be after the node's report shows it done.
            told = rf"run {run_id} of replica \S+ recorded as lost; its sandbox was told to stop"
            ended = rf"session {session_id} of replica \S+ ended on node"
            try:
                eventually("B to log the sweep's cancel and end", lambda: _logged(b, told, ended))
            except AssertionError:
                raise AssertionError((b.home / "serve.log").read_text()[-2000:]) from None
            assert cb.get(f"/v1/sessions/{session_id}").status_code == 404
            listed = [r["run_id"] for r in cb.get("/v1/audit").json()]
            assert listed.count(run_id) == 1
    finally:
        a.stop(signal.SIGKILL)
        assert b.stop() == -signal.SIGTERM


def test_a_session_nobody_sweeps_ends_after_its_idle_timeout(setup: Setup, tmp_path: Path) -> None:
    # No other replica is alive: nobody sweeps C, and its session's sandbox is the agent's.
    c = _replica(setup, tmp_path / "c")
    try:
        key = setup.shared.tenant(c.home, "orphan", max_concurrent=4)
        with c.client(key) as cc:
            opened = cc.post("/v1/sessions", json={"idle_timeout_s": 10})
            assert opened.status_code in (200, 201), opened.text
            # Killed before its own watchdog could end the session (10 s idle).
            c.stop(signal.SIGKILL)
        eventually(
            "the agent's report to count the session",
            lambda: sum(r.sessions for r in _reports(setup)) == 1 or None,
        )
        eventually(
            "the agent to end the untouched sandbox",
            lambda: all(r.sessions == 0 for r in _reports(setup)) or None,
            deadline_s=90 + IDLE_GRACE_S,
        )
        _no_sandbox_left(setup)
    finally:
        c.stop(signal.SIGKILL)
