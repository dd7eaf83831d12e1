"""Replicas sharing one PostgreSQL database (``$SANDCELL_DATABASE_URL``): two real ``sandcell
serve`` processes on loopback ports, each with a home of its own, one database and one shared
directory between them.

The record is one hash chain whichever replica ran a run; a tenant added once is known to both;
quotas count across both; a replica killed with a run in flight has that run recorded once as
lost by the other; PostgreSQL restarting under a replica makes it answer 503 while it is down and
costs no record. The first tests share two replicas (they leave nothing running); the
destructive ones start processes (and a PostgreSQL) of their own.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
from tests.pg_server import PostgresServer
from tests.service.replicas import (
    LONG_RUN,
    Cluster,
    cluster_in,
    cluster_of,
    eventually,
    finished,
)
from tests.service.server import ServiceProcess


@pytest.fixture(scope="module")
def cluster(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with cluster_in(postgres_server, tmp_path_factory) as made:
        yield made


@pytest.fixture(scope="module")
def pair(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    root = tmp_path_factory.mktemp("replicas")
    a, b = cluster.replicas(root / "a", root / "b")
    yield a, b
    codes = (a.stop(), b.stop())
    assert codes == (-signal.SIGTERM, -signal.SIGTERM)


@pytest.fixture(scope="module")
def recorded() -> list[str]:
    """The run ids the module's shared replicas recorded so far (the chain's expected count)."""
    return []


def _too_many(response: httpx2.Response) -> None:
    assert response.status_code == 429, response.text
    assert int(response.headers["Retry-After"]) >= 1


# --- shared replicas ----------------------------------------------------------------------------


def test_the_record_is_one_chain(
    cluster: Cluster, pair: tuple[ServiceProcess, ServiceProcess], recorded: list[str]
) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "chain")
    made: list[tuple[str, str]] = []
    with a.client(key) as ca, b.client(key) as cb:
        for i, c in enumerate((ca, cb, ca, cb)):
            got = c.post("/v1/runs", json={"code": f"print({i} * 7)"})
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["result"]["outcome"] == "ok", body
            made.append((body["id"], f"{i * 7}\n"))
        recorded += [run_id for run_id, _ in made]
        # Every run is visible from either replica, whichever ran it.
        for c in (ca, cb):
            for run_id, stdout in made:
                seen = c.get(f"/v1/runs/{run_id}")
                assert seen.status_code == 200, seen.text
                assert seen.json()["status"] == "finished"
                assert seen.json()["result"]["stdout"] == stdout
                record = c.get(f"/v1/audit/{run_id}")
                assert record.status_code == 200, record.text
            listed = {r["run_id"] for r in c.get("/v1/audit").json()}
            assert {run_id for run_id, _ in made} <= listed
        seqs = sorted(cb.get(f"/v1/audit/{run_id}").json()["seq"] for run_id, _ in made)
        assert len(set(seqs)) == len(made)  # one chain: four places in it, none shared
    for home in (a.home, b.home):
        assert cluster.verified_count(home) == len(recorded)


def test_a_tenant_added_once_is_known_to_both(
    cluster: Cluster, pair: tuple[ServiceProcess, ServiceProcess]
) -> None:
    a, b = pair
    key = cluster.tenant(b.home, "everywhere")
    for replica in (a, b):
        with replica.client(key) as c:
            me = c.get("/v1/tenant")
            assert me.status_code == 200, me.text
            assert me.json()["name"] == "everywhere"
        with replica.client("sc_not-a-key") as c:
            assert c.get("/v1/tenant").status_code == 401


def test_max_concurrent_counts_across_replicas(
    cluster: Cluster, pair: tuple[ServiceProcess, ServiceProcess], recorded: list[str]
) -> None:
    a, b = pair
    key = cluster.tenant(a.home, "busy", max_concurrent=2)
    with a.client(key) as ca, b.client(key) as cb:
        long_runs: list[tuple[httpx2.Client, str]] = []
        for c in (ca, cb):
            got = c.post("/v1/runs", json=LONG_RUN)
            assert got.status_code == 202, got.text
            long_runs.append((c, got.json()["id"]))
        assert ca.get("/v1/tenant").json()["in_flight"] == 2
        for c in (ca, cb):
            _too_many(c.post("/v1/runs", json={"code": "print(1)"}))
        for c, run_id in long_runs:
            assert c.post(f"/v1/runs/{run_id}/cancel").status_code == 202
        for c, run_id in long_runs:
            body = eventually(f"run {run_id} to end", finished(c, run_id))
            assert body["result"]["outcome"] == "killed"  # type: ignore[index]
        recorded += [run_id for _, run_id in long_runs]
        for c in (ca, cb):
            got = c.post("/v1/runs", json={"code": "print(1)"})
            assert got.status_code == 200, got.text
            recorded.append(got.json()["id"])


def test_runs_per_minute_counts_across_replicas(
    cluster: Cluster, pair: tuple[ServiceProcess, ServiceProcess], recorded: list[str]
) -> None:
    a, b = pair
    key = cluster.tenant(b.home, "hasty", runs_per_minute=3)
    with a.client(key) as ca, b.client(key) as cb:
        for c in (ca, cb, ca):
            got = c.post("/v1/runs", json={"code": "print(2)"})
            assert got.status_code == 200, got.text
            recorded.append(got.json()["id"])
        for c in (cb, ca):
            _too_many(c.post("/v1/runs", json={"code": "print(3)"}))
    assert cluster.verified_count(a.home) == len(recorded)


# --- destructive: processes of their own --------------------------------------------------------


def _record(client: httpx2.Client, run_id: str) -> Callable[[], dict[str, object] | None]:
    def probe() -> dict[str, object] | None:
        got = client.get(f"/v1/audit/{run_id}")
        if got.status_code == 404:
            return None
        assert got.status_code == 200, got.text
        body: dict[str, object] = got.json()
        return body

    return probe


def test_a_killed_replica_s_run_is_recorded_lost_once(postgres_url: str, tmp_path: Path) -> None:
    cluster = cluster_of(postgres_url, tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    # B notices a silent replica after 3 s (and beats often enough not to seem dead itself).
    quick = {"SANDCELL_REPLICA_DEAD_AFTER_S": "3"}
    a, b = cluster.replicas(tmp_path / "a", tmp_path / "b", **quick)
    try:
        key = cluster.tenant(a.home, "victim", max_concurrent=2)
        with a.client(key) as ca, b.client(key) as cb:
            got = ca.post("/v1/runs", json=LONG_RUN)
            assert got.status_code == 202, got.text
            run_id = got.json()["id"]
            eventually(
                "the run to be running",
                lambda: ca.get(f"/v1/runs/{run_id}").json()["status"] == "running" or None,
            )
            assert cb.get("/v1/tenant").json()["in_flight"] == 1
            a.stop(signal.SIGKILL)

            record = eventually("B to record the lost run", _record(cb, run_id))
            result = record["record"]
            assert isinstance(result, dict)
            assert result["outcome"] == "infra_error"
            assert str(result["reason"]).startswith("replica lost")
            seen = cb.get(f"/v1/runs/{run_id}").json()
            assert seen["status"] == "finished" and seen["record_only"] is True
            listed = [r["run_id"] for r in cb.get("/v1/audit").json()]
            assert listed.count(run_id) == 1
            # The dead replica's hold no longer counts: B admits max_concurrent runs.
            assert cb.get("/v1/tenant").json()["in_flight"] == 0
            again = [cb.post("/v1/runs", json=LONG_RUN) for _ in range(2)]
            assert [r.status_code for r in again] == [202, 202], [r.text for r in again]
            for r in again:
                assert cb.post(f"/v1/runs/{r.json()['id']}/cancel").status_code == 202
            for r in again:
                eventually("the run to end", finished(cb, r.json()["id"]))
            listed = [r["run_id"] for r in cb.get("/v1/audit").json()]
            assert listed.count(run_id) == 1
        assert cluster.verified_count(b.home) == 3
    finally:
        for replica in (a, b):
            replica.stop()  # A is gone already: only B is asked to stop


def _health(client: httpx2.Client, status: int) -> Callable[[], dict[str, object] | None]:
    def probe() -> dict[str, object] | None:
        got = client.get("/healthz")
        body: dict[str, object] = got.json()
        return body if got.status_code == status else None

    return probe


def test_postgres_restarting_under_replicas(tmp_path: Path, postgres_server: object) -> None:
    """PostgreSQL stops for longer than makes a replica dead, with a run in flight on A: both
    answer 503 meanwhile; once it is back, neither takes the other for dead (every beat was
    missed alike), the run ends with its own record, once, and requests work again."""
    del postgres_server  # only for its skip or failure where PostgreSQL cannot run
    dead_after_s = 2.0
    with PostgresServer() as pg:
        url = pg.create_database("replicas")
        cluster = cluster_of(
            url,
            tmp_path / "shared",
            SANDCELL_RECORD_WAIT_S="120",
            SANDCELL_REPLICA_DEAD_AFTER_S=str(dead_after_s),
        )
        (tmp_path / "shared").mkdir()
        a, b = cluster.replicas(tmp_path / "a", tmp_path / "b")
        try:
            key = cluster.tenant(a.home, "steady")
            with (
                a.client(key) as ca,
                b.client(key) as cb,
                a.client(None) as anon_a,
                b.client(None) as anon_b,
            ):
                got = ca.post(
                    "/v1/runs",
                    json={"code": "import time\ntime.sleep(1)\nprint('done')", "wait": False},
                )
                assert got.status_code == 202, got.text
                run_id = got.json()["id"]
                eventually(
                    "the run to be running",
                    lambda: ca.get(f"/v1/runs/{run_id}").json()["status"] == "running" or None,
                )
                pg.stop()
                stopped = time.monotonic()

                for c in (ca, cb):
                    refused = c.post("/v1/runs", json={"code": "print(1)"})
                    assert refused.status_code == 503, refused.text
                    assert int(refused.headers["Retry-After"]) >= 1
                down = [
                    eventually("/healthz to say the database is down", _health(anon, 503))
                    for anon in (anon_a, anon_b)
                ]
                for body in down:
                    assert body["status"] == "database_unreachable", body
                    assert "database" in str(body["detail"]), body
                assert down[0]["replica"] and down[1]["replica"]
                assert down[0]["replica"] != down[1]["replica"]
                for anon in (anon_a, anon_b):  # alive all the same: no reason to restart it
                    assert anon.get("/livez").status_code == 200
                # A lower bound, not a timing assumption: the outage must outlast the time that
                # makes a silent replica dead (a slow machine only makes it longer).
                eventually(
                    "an outage longer than a replica's death",
                    lambda: time.monotonic() - stopped > dead_after_s + 1 or None,
                )

                pg.start()
                for anon in (anon_a, anon_b):
                    up = eventually("/healthz to be ok again", _health(anon, 200))
                    assert up["status"] == "ok" and up["replica"], up
                body = eventually("the run to end", finished(ca, run_id))
                assert body["result"]["outcome"] == "ok", body  # type: ignore[index]
                assert body["result"]["stdout"] == "done\n"  # type: ignore[index]
                for c in (ca, cb):
                    again = c.post("/v1/runs", json={"code": "print(1)"})
                    assert again.status_code == 200, again.text
                record = cb.get(f"/v1/audit/{run_id}").json()["record"]
                assert record["outcome"] == "ok", record  # not taken for lost by B
                listed = [r["run_id"] for r in cb.get("/v1/audit").json()]
                assert listed.count(run_id) == 1
                assert len(listed) == 3
                assert cb.get("/v1/tenant").json()["in_flight"] == 0
            assert cluster.verified_count(b.home) == 3
        finally:
            if not pg.is_running():
                pg.start()
            for replica in (a, b):
                replica.stop()
