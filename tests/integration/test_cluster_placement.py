"""Runs placed on the nodes of a real local Ray cluster (docs/cluster.md, "Nodes and placement").

One cluster for the module: three ``ray start`` nodes on loopback, each with its own sandcell
home, one CPU and two ``sandcell_slots``; node ``c`` declares ``sandcell_rung_namespaces`` alone,
so it offers no other rung. The test process is the replica: an Executor whose runs the cluster
places. The replica and nodes ``b`` and ``c`` share one ``$SANDCELL_SHARED_DIR`` (their artifacts
land once, and a state saved on one node resumes on another); node ``a`` has none, so what its
runs export travels back as bytes. The node kill comes last: it leaves the cluster with two nodes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'sandcell[ray]'")

from tests.integration.loopback_http import JsonHandler, serving
from tests.ray_cluster import Cluster, kill_node, local_cluster
from tests.service.server import ServiceProcess, add_tenant

from sandcell.audit import AuditLog
from sandcell.backends.cell.state import PauseMode, PauseRefused
from sandcell.cluster import Cluster as Placement
from sandcell.cluster.backend import ClusterBackend
from sandcell.errors import IsolationUnavailable
from sandcell.executor import Executor
from sandcell.home import SHARED_DIR_ENV
from sandcell.spec import InputFile, Outcome, RunRequest, RunResult

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SLOTS_PER_NODE = 2
WAIT_S = 120.0
SHARED_NODES = ("b", "c")
"""The nodes started with the replica's ``$SANDCELL_SHARED_DIR``."""


@dataclass(frozen=True)
class Replica:
    nodes: Cluster
    placement: Placement
    executor: Executor
    home: Path
    name_of: dict[str, str]
    """Node id → node name (a, b, c)."""


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    shared = tmp_path_factory.mktemp("shared")
    with (
        local_cluster(
            ("a", "b", "c"),
            slots=SLOTS_PER_NODE,
            extra_resources={"c": {"sandcell_rung_namespaces": 1}},
            node_env={n: {SHARED_DIR_ENV: str(shared)} for n in SHARED_NODES},
            prefix="sccl-",
        ) as nodes,
        pytest.MonkeyPatch.context() as env,
    ):
        # Set once the nodes started (they would inherit it): the replica's bulk bytes.
        env.setenv(SHARED_DIR_ENV, str(shared))
        home = tmp_path_factory.mktemp("replica-home")
        placement = Placement.connect(nodes.address, home=home)
        try:
            reports = placement.reports()
            by_home = {str(h): name for name, h in nodes.homes.items()}
            name_of = {r.node_id: by_home[r.home] for r in reports}
            assert sorted(name_of.values()) == ["a", "b", "c"], reports
            executor = Executor(home=home, cluster=placement)
            try:
                yield Replica(nodes, placement, executor, home, name_of)
            finally:
                executor.close()
        finally:
            placement.close()


def _node_of(replica: Replica, result: RunResult) -> str:
    entry = replica.executor.audit.get(result.run_id)
    assert entry is not None, f"run {result.run_id} has no record"
    backend = entry.record["backend"]
    assert isinstance(backend, dict)
    return replica.name_of[str(backend["node_id"])]


def _ticking(seconds: float) -> str:
    """A program that says it started, then sleeps (stopped by a cancel or a node loss)."""
    return f"import time\nprint('tick', flush=True)\ntime.sleep({seconds})\nprint('done')"


def test_runs_spread_over_every_node_with_inputs_artifacts_and_output(
    replica: Replica, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("from the replica")
    code = (
        "import time\n"
        "text = open('/inputs/data.txt').read()\n"
        "open('out.txt', 'w').write(text.upper())\n"
        "time.sleep(0.5)\n"
        "print(text)"
    )
    request = RunRequest(
        code=code, inputs=(InputFile(host_path=data, name="data.txt"),), exports=("out.txt",)
    )
    pieces: dict[int, list[str]] = {i: [] for i in range(6)}

    def one(i: int) -> RunResult:
        return replica.executor.run(request, on_output=lambda _s, t: pieces[i].append(t))

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    assert all(r.outcome is Outcome.OK for r in results), [r.reason for r in results]
    assert all(r.stdout == "from the replica\n" for r in results)
    assert all("".join(p) == "from the replica\n" for p in pieces.values()), pieces
    placed = Counter(_node_of(replica, r) for r in results)
    assert set(placed) == {"a", "b", "c"}, placed

    # Each artifact is in the replica's store: node a's store is another directory (its
    # artifacts travel back as bytes), b's and c's are the shared one.
    stores = {replica.name_of[r.node_id]: r.store_id for r in replica.placement.reports()}
    own_store = replica.placement.store_id
    assert stores["a"] != own_store and stores["b"] == stores["c"] == own_store, stores
    (artifact,) = results[0].artifacts
    stored = replica.executor.store.path_for(artifact.sha256).read_bytes()
    assert stored == b"FROM THE REPLICA"
    assert hashlib.sha256(stored).hexdigest() == artifact.sha256
    assert replica.executor.audit.verify().ok


def test_a_node_without_a_rung_never_gets_it(replica: Replica) -> None:
    offered = {replica.name_of[r.node_id]: r.rungs for r in replica.placement.reports()}
    assert offered["c"] == ("namespaces",)
    if "gvisor" not in offered["a"] or "gvisor" not in offered["b"]:
        pytest.skip(f"gVisor cannot run on this host (nodes offer {offered})")
    with Executor(home=replica.home, backend="gvisor", cluster=replica.placement) as ex:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: ex.run(RunRequest(code="print(7)")), range(3)))
        assert all(r.outcome is Outcome.OK for r in results), [r.reason for r in results]
        entries = [ex.audit.get(r.run_id) for r in results]
    nodes = set()
    for entry in entries:
        assert entry is not None
        backend = entry.record["backend"]
        assert isinstance(backend, dict)
        assert backend["name"] == "gvisor"
        nodes.add(replica.name_of[str(backend["node_id"])])
    assert "c" not in nodes, nodes


def _start_ticking(
    replica: Replica, count: int, seconds: float
) -> tuple[list[threading.Thread], dict[str, RunResult], dict[str, threading.Event]]:
    """``count`` runs started on threads; returns them, their results by run id (once they
    end), and an event per run id set when its program said 'tick'."""
    results: dict[str, RunResult] = {}
    ticked = {uuid.uuid4().hex: threading.Event() for _ in range(count)}

    def one(run_id: str) -> None:
        def heard(_stream: str, text: str) -> None:
            if "tick" in text:
                ticked[run_id].set()

        results[run_id] = replica.executor.run(
            RunRequest(code=_ticking(seconds)), run_id=run_id, on_output=heard
        )

    threads = [threading.Thread(target=one, args=(r,)) for r in ticked]
    for t in threads:
        t.start()
    for run_id, event in ticked.items():
        assert event.wait(WAIT_S), f"run {run_id} never said tick"
    return threads, results, ticked


def _backend(replica: Replica) -> ClusterBackend:
    backend = replica.executor.backend
    assert isinstance(backend, ClusterBackend)
    return backend


def test_live_output_comes_while_running_and_cancel_reaches_the_node(replica: Replica) -> None:
    threads, results, ticked = _start_ticking(replica, 1, 60)
    (run_id,) = ticked
    assert _backend(replica).node_of(run_id) is not None
    assert replica.executor.cancel(run_id, "the test is done with it")
    threads[0].join(WAIT_S)
    result = results[run_id]
    assert result.outcome is Outcome.KILLED, result.reason
    assert "the test is done with it" in result.reason
    assert "done" not in result.stdout


def test_cluster_status_shows_every_node(replica: Replica) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandcell",
            "cluster",
            "status",
            "--cluster",
            replica.nodes.address,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    nodes = json.loads(proc.stdout.strip().splitlines()[-1])["nodes"]
    by_name = {replica.name_of[n["node_id"]]: n for n in nodes}
    assert sorted(by_name) == ["a", "b", "c"]
    for node in nodes:
        assert node["agent"] == "running"
        assert node["slots"] == SLOTS_PER_NODE
        assert 0 <= node["free_slots"] <= SLOTS_PER_NODE
        assert "namespaces" in node["rungs"]
    assert by_name["c"]["rungs"] == ["namespaces"]
    assert by_name["c"]["declared_rungs"] == ["namespaces"]


def _elsewhere(replica: Replica, *names: str) -> Placement:
    """A placement on the named nodes only: real placement, restricted as when draining."""
    ids = frozenset(i for i, n in replica.name_of.items() if n in names)
    return Placement(replica.placement.ray, home=replica.home, only_nodes=ids)


def test_a_session_lives_on_a_node_and_its_cells_reach_it(replica: Replica, tmp_path: Path) -> None:
    own = replica.name_of[replica.placement.own_node_id]
    other = next(n for n in ("a", "b", "c") if n != own)
    data = tmp_path / "seed.txt"
    data.write_text("41")
    placement = _elsewhere(replica, other)
    try:
        with Executor(home=replica.home, cluster=placement) as ex:
            session = ex.session(inputs=(InputFile(host_path=data, name="seed.txt"),))
            try:
                first = session.run("x = int(open('/inputs/seed.txt').read())")
                assert first.outcome is Outcome.OK, first.reason
                heard: list[str] = []
                second = session.run("print(x + 1)", on_output=lambda _s, t: heard.append(t))
                assert (second.outcome, second.stdout, "".join(heard)) == (
                    Outcome.OK,
                    "42\n",
                    "42\n",
                )
                entry = ex.audit.get(second.run_id)
                assert entry is not None
                backend = entry.record["backend"]
                assert isinstance(backend, dict)
                assert replica.name_of[str(backend["node_id"])] == other
                placement.refresh(wait_s=WAIT_S)
                sessions = {replica.name_of[r.node_id]: r.sessions for r in placement.reports()}
                assert sessions == {other: 1}

                # A cancel reaches the node; the session and its state go on.
                ticked = threading.Event()
                results: list[RunResult] = []
                cell = threading.Thread(
                    target=lambda: results.append(
                        session.run(
                            _ticking(60),
                            on_output=lambda _s, t: ticked.set() if "tick" in t else None,
                        )
                    )
                )
                cell.start()
                assert ticked.wait(WAIT_S), "the cell never said tick"
                assert session.cancel("enough")
                cell.join(WAIT_S)
                assert results[0].outcome is Outcome.KILLED, results[0].reason
                assert session.run("print(x)").stdout == "41\n"
                session.run("open('made.txt', 'w').write('on the node')")
            finally:
                end = session.close(exports=("made.txt",))
            (artifact,) = end.artifacts
            assert ex.store.path_for(artifact.sha256).read_bytes() == b"on the node"
            placement.refresh(wait_s=WAIT_S)
            assert all(r.sessions == 0 for r in placement.reports())
    finally:
        placement.close()


def _cell_node(replica: Replica, ex: Executor, result: RunResult) -> str:
    """The node a session's cell ran on, from its record."""
    assert result.outcome is Outcome.OK, result.reason + result.stderr
    entry = ex.audit.get(result.run_id)
    assert entry is not None, f"cell {result.run_id} has no record"
    backend = entry.record["backend"]
    assert isinstance(backend, dict)
    return replica.name_of[str(backend["node_id"])]


def _two_nodes(replica: Replica, among: tuple[str, ...]) -> tuple[str, str]:
    """Two of ``among``: where a state is saved, then where it comes back; the replica's own
    node last, since it sees the replica's states even without the shared directory."""
    own = replica.name_of.get(replica.placement.own_node_id)
    first, second, *_ = sorted(among, key=lambda n: n == own)
    return first, second


def test_a_paused_session_resumes_on_another_node_and_a_snapshot_opens_on_another(
    replica: Replica,
) -> None:
    saved_on, back_on = _two_nodes(replica, SHARED_NODES)
    there, here = _elsewhere(replica, saved_on), _elsewhere(replica, back_on)
    try:
        with (
            Executor(home=replica.home, cluster=there) as ex_x,
            Executor(home=replica.home, cluster=here) as ex_y,
        ):
            session = ex_x.session()
            made = session.run("open('kept.txt', 'w').write('made on x')\nx = 5\nprint(x)")
            assert _cell_node(replica, ex_x, made) == saved_on
            assert PauseMode.FILES in session.pause_modes, session.pause_modes
            paused = session.pause(mode=PauseMode.FILES)
            assert paused.kind == "paused"
            assert session.ended is not None
            there.refresh(wait_s=WAIT_S)
            assert all(r.sessions == 0 for r in there.reports())

            back = ex_y.resume(session.id)
            try:
                assert back.id == session.id
                got = back.run("print(open('kept.txt').read(), 'x' in globals())")
                assert got.stdout == "made on x False\n", got.stdout + got.stderr
                assert _cell_node(replica, ex_y, got) == back_on
            finally:
                back.close()

            # A snapshot taken on one node opens as a new session on another; both go on.
            original = ex_x.session()
            try:
                original.run("open('seed.txt', 'w').write('seeded on x')")
                snap = original.snapshot("cross-node", mode=PauseMode.FILES)
                copy = ex_y.session(snapshot="cross-node")
                try:
                    read = copy.run("print(open('seed.txt').read())")
                    assert read.stdout == "seeded on x\n", read.stdout + read.stderr
                    assert _cell_node(replica, ex_y, read) == back_on
                    assert copy.id != original.id
                finally:
                    copy.close()
                still = original.run("print(open('seed.txt').read())")
                assert still.stdout == "seeded on x\n"
                assert _cell_node(replica, ex_x, still) == saved_on
            finally:
                original.close()
            ex_x.states.delete(snap.id, owner=None)
    finally:
        there.close()
        here.close()


def test_without_the_shared_dir_states_stay_on_the_replicas_own_node(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_id = replica.placement.own_node_id
    own = replica.name_of.get(own_id)
    if own is None:
        pytest.skip("the replica's own node is not one of the cluster's sandcell nodes")
    away = next(n for n in SHARED_NODES if n != own)
    # A replica without the shared directory: its states are under its own home.
    monkeypatch.delenv(SHARED_DIR_ENV)
    there, mine = _elsewhere(replica, away), _elsewhere(replica, own)
    anywhere = Placement(replica.placement.ray, home=replica.home)
    try:
        with Executor(home=replica.home, cluster=there) as ex:
            session = ex.session()
            try:
                assert _cell_node(replica, ex, session.run("x = 1")) == away
                assert session.pause_modes == frozenset()
                with pytest.raises(PauseRefused, match=SHARED_DIR_ENV):
                    session.pause(mode=PauseMode.FILES)
                assert session.ended is None
            finally:
                session.close()
        with Executor(home=replica.home, cluster=mine) as ex:
            session = ex.session()
            session.run("open('kept.txt', 'w').write('kept at home')")
            session.pause(mode=PauseMode.FILES)
        with (
            Executor(home=replica.home, cluster=there) as ex,
            pytest.raises(IsolationUnavailable, match=r"needs this replica's host"),
        ):
            ex.resume(session.id)
        with Executor(home=replica.home, cluster=anywhere) as ex:
            back = ex.resume(session.id)
            try:
                got = back.run("print(open('kept.txt').read())")
                assert got.stdout == "kept at home\n", got.stdout + got.stderr
                assert _cell_node(replica, ex, got) == own
            finally:
                back.close()
    finally:
        for placement in (there, mine, anywhere):
            placement.close()


def test_a_memory_pause_resumes_on_another_node_with_its_variables(replica: Replica) -> None:
    offered = {replica.name_of[r.node_id]: r.rungs for r in replica.placement.reports()}
    gvisor = tuple(n for n in ("a", "b", "c") if "gvisor" in offered[n])
    if len(gvisor) < 2:
        pytest.skip(f"a memory pause needs gVisor on two nodes (nodes offer {offered})")
    saved_on, back_on = _two_nodes(replica, gvisor)
    there, here = _elsewhere(replica, saved_on), _elsewhere(replica, back_on)
    try:
        with (
            Executor(home=replica.home, backend="gvisor", cluster=there) as ex_x,
            Executor(home=replica.home, backend="gvisor", cluster=here) as ex_y,
        ):
            session = ex_x.session()
            made = session.run("open('kept.txt', 'w').write('made on x')\nx = 41")
            assert _cell_node(replica, ex_x, made) == saved_on
            if PauseMode.MEMORY not in session.pause_modes:
                session.close()
                pytest.skip(f"gVisor here offers {sorted(session.pause_modes)} only")
            session.pause(mode=PauseMode.MEMORY)
            back = ex_y.resume(session.id)
            try:
                got = back.run("print(x + 1, open('kept.txt').read())")
                assert got.stdout == "42 made on x\n", got.stdout + got.stderr
                assert _cell_node(replica, ex_y, got) == back_on
                entry = ex_y.audit.get(got.run_id)
                assert entry is not None
                backend = entry.record["backend"]
                assert isinstance(backend, dict)
                assert backend["name"] == "gvisor", backend
            finally:
                back.close()
    finally:
        there.close()
        here.close()


class _Hello(JsonHandler):
    def do_GET(self) -> None:
        self.send_json({"hello": "from outside"})


def _net_profile(folder: Path, port: int) -> Path:
    """The built-in ``unchecked`` profile with an allowlist of one loopback port."""
    text = (REPO / "src" / "sandcell" / "policy" / "builtin" / "unchecked.toml").read_text()
    start, end = text.index("[network]"), text.index("[isolation]")
    net = (
        f'[network]\nmode = "allowlist"\nhosts = ["127.0.0.1:{port}"]\n'
        'allow_addresses = ["127.0.0.1/32"]\n'
    )
    path = folder / "net.toml"
    path.write_text(text[:start] + net + "\n" + text[end:])
    return path


def test_a_run_with_an_egress_proxy_runs_on_the_replicas_own_node_only(
    replica: Replica, tmp_path: Path
) -> None:
    code = (
        "import os, urllib.request\n"
        "proxy = urllib.request.ProxyHandler({'http': os.environ['http_proxy']})\n"
        "print(urllib.request.build_opener(proxy).open('http://127.0.0.1:{PORT}/').read())"
    )
    with serving(_Hello) as port:
        profile = str(_net_profile(tmp_path, port))
        request = RunRequest(code=code.replace("{PORT}", str(port)))
        result = replica.executor.run(request, profile=profile)
        assert result.outcome is Outcome.OK, result.reason + result.stderr
        assert "from outside" in result.stdout
        entry = replica.executor.audit.get(result.run_id)
        assert entry is not None
        backend = entry.record["backend"]
        assert isinstance(backend, dict)
        assert backend["node_id"] == replica.placement.own_node_id

        # A replica whose own node is not among the nodes it may use cannot run it.
        others = frozenset(i for i in replica.name_of if i != replica.placement.own_node_id)
        elsewhere = Placement(replica.placement.ray, home=replica.home, only_nodes=others)
        try:
            with Executor(home=replica.home, cluster=elsewhere) as ex:
                with pytest.raises(IsolationUnavailable, match=r"needs this replica's host"):
                    ex.run(request, profile=profile)
                assert ex.run(RunRequest(code="print(2)")).outcome is Outcome.OK
        finally:
            elsewhere.close()


def test_sandcell_serve_places_runs_on_the_cluster(replica: Replica, tmp_path: Path) -> None:
    home = tmp_path / "serve-home"
    home.mkdir()
    key = add_tenant(home, "t1")
    service = ServiceProcess(
        home, args=("--cluster", replica.nodes.address, "--start", "cold", "--no-socket")
    )
    service.start(timeout=WAIT_S)
    try:
        with service.client(key) as client:
            answer = client.post("/v1/runs", json={"code": "print(6 * 7)"})
            assert answer.status_code == 200, answer.text
            body = answer.json()["result"]
            assert body["outcome"] == "ok", body
            assert body["stdout"] == "42\n"
    finally:
        service.stop()
    with AuditLog(home / "audit.sqlite3") as log:
        entry = log.get(body["run_id"])
        assert entry is not None
        backend = entry.record["backend"]
        assert isinstance(backend, dict)
        assert backend["node_id"] in replica.name_of


def test_a_node_killed_mid_run_ends_its_runs_node_lost_its_paused_session_resumes_elsewhere(
    replica: Replica,
) -> None:
    backend = _backend(replica)
    own = replica.name_of.get(replica.placement.own_node_id)
    # Not the head (the cluster would go with it), not the replica's own node (its driver).
    victim = next(n for n in ("b", "c") if n != own)
    doomed = _elsewhere(replica, victim)
    session_ex = Executor(home=replica.home, cluster=doomed)
    session = session_ex.session()
    assert session.run("y = 1").outcome is Outcome.OK
    # A session paused on the node before it dies (its state is in the shared directory).
    paused = session_ex.session()
    made = paused.run("open('kept.txt', 'w').write('saved before the loss')")
    assert _cell_node(replica, session_ex, made) == victim
    paused.pause(mode=PauseMode.FILES)
    threads, results, ticked = _start_ticking(replica, 2 * len(replica.name_of), 60)
    on_victim = [r for r in ticked if replica.name_of.get(backend.node_of(r) or "") == victim]
    assert on_victim, "no run was placed on the node to be killed"
    kill_node(replica.nodes, victim)
    for run_id in ticked:
        if run_id not in on_victim:
            replica.executor.cancel(run_id, "the test is done with it")
    for t in threads:
        t.join(WAIT_S)
    for run_id in ticked:
        result = results[run_id]
        if run_id in on_victim:
            assert result.outcome is Outcome.INFRA_ERROR, result.reason
            assert result.reason.startswith("node lost"), result.reason
        else:
            assert result.outcome is Outcome.KILLED, result.reason
    # Recorded once each, in one chain that verifies.
    recorded = Counter(e.run_id for e in replica.executor.audit.list(limit=1000))
    assert all(recorded[r] == 1 for r in ticked), recorded
    assert replica.executor.audit.verify().ok

    # The session's sandbox went with its node: its next cell says so and the session ends.
    lost = session.run("print(y)")
    assert lost.outcome is Outcome.INFRA_ERROR, lost.reason
    assert lost.reason.startswith("node lost"), lost.reason
    assert session.ended is not None
    session.close()
    session_ex.close()
    doomed.close()

    # Its paused session survives the node and resumes on one still there.
    back = replica.executor.resume(paused.id)
    try:
        got = back.run("print(open('kept.txt').read())")
        assert got.stdout == "saved before the loss\n", got.stdout + got.stderr
        assert _cell_node(replica, replica.executor, got) != victim
    finally:
        back.close()

    with ThreadPoolExecutor(4) as pool:
        later = list(
            pool.map(lambda _: replica.executor.run(RunRequest(code="print(1)")), range(4))
        )
    assert all(r.outcome is Outcome.OK for r in later), [r.reason for r in later]
    assert victim not in {_node_of(replica, r) for r in later}
