"""The Ray head restarts under a replica (docs/cluster.md, "Failures": "The Ray head restarts").

A module of its own, with a cluster of its own: the whole cluster goes down and comes back. A
real ``sandcell serve --cluster`` on a local cluster of two ``ray start`` nodes: every process
of the cluster is killed while a run is in flight; the run ends ``infra_error`` (node lost),
``/healthz`` answers 503 ``cluster_unreachable``, a new run is refused at once with 503; the
head comes back on the same port with the same temp dirs, its node joins it again, and a run
through the same replica (never restarted) succeeds.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'sandcell[ray]'")

from tests.ray_cluster import Cluster, kill_node, local_cluster, restart_cluster
from tests.service.replicas import LONG_RUN, eventually
from tests.service.server import ServiceProcess, add_tenant

pytestmark = pytest.mark.slow

QUICK = {"code": "print(6 * 7)"}


@pytest.fixture(scope="module")
def nodes() -> Iterator[Cluster]:
    with local_cluster(("a", "b"), slots=2, prefix="schr-") as made:
        yield made


def _health(client: httpx2.Client, status: int) -> dict[str, object] | None:
    got = client.get("/healthz")
    body: dict[str, object] = got.json()
    return body if got.status_code == status else None


def _finished(client: httpx2.Client, run_id: str) -> dict[str, object] | None:
    got = client.get(f"/v1/runs/{run_id}")
    assert got.status_code == 200, got.text
    body: dict[str, object] = got.json()
    return body if body["status"] == "finished" else None


def _ran(client: httpx2.Client) -> dict[str, object] | None:
    got = client.post("/v1/runs", json=QUICK)
    if got.status_code != 200:
        return None
    body: dict[str, object] = got.json()["result"]
    return body


def test_the_replica_outlives_a_restarted_head(nodes: Cluster, tmp_path: Path) -> None:
    home = tmp_path / "replica"
    home.mkdir()
    replica = ServiceProcess(home, args=("--cluster", nodes.address)).start(timeout=180)
    try:
        key = add_tenant(home, "t", profiles=("strict",), max_concurrent=4)
        with replica.client(key) as c:
            first = _ran(c)
            assert first is not None and first["outcome"] == "ok", first
            got = c.post("/v1/runs", json=LONG_RUN)
            assert got.status_code == 202, got.text
            run_id = got.json()["id"]
            eventually(
                "the run to be running",
                lambda: c.get(f"/v1/runs/{run_id}").json()["status"] == "running" or None,
            )

            for name in nodes.sessions:
                kill_node(nodes, name)
            down = eventually("/healthz to say the cluster is unreachable", lambda: _health(c, 503))
            assert down["status"] == "cluster_unreachable", down
            assert "unreachable" in str(down["detail"])
            lost = eventually("the run in flight to end", lambda: _finished(c, run_id))
            result = lost["result"]
            assert isinstance(result, dict)
            assert result["outcome"] == "infra_error", result
            assert str(result["reason"]).startswith("node lost"), result
            refused = c.post("/v1/runs", json=QUICK)
            assert refused.status_code == 503, refused.text
            assert "unreachable" in refused.text

            restart_cluster(nodes)
            eventually("/healthz to be ok again", lambda: _health(c, 200), deadline_s=180)
            again = eventually("a run to succeed through the same replica", lambda: _ran(c))
            assert again["outcome"] == "ok", again
            assert "42" in str(again["stdout"])
    finally:
        assert replica.stop() == -signal.SIGTERM
    # A graceful stop still, after connecting again (Ray's own SIGTERM handler stays out).
    assert "Application shutdown complete" in (home / "serve.log").read_text()
