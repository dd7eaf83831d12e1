"""``sandcell batch --ray`` and the Ray API on a real local Ray cluster started here.

One cluster for the module: a head node and a worker node (``ray start`` subprocesses, each with
its own ``--temp-dir`` and its own sandcell home, two ``sandcell_slots`` each). The batch must use
both nodes, keep each run's record on the node that ran it, bring artifacts back to the driver,
resume after the driver is interrupted, and, when the worker node is killed mid-batch, finish its
tasks on the head with no result lost or written twice. The node kill comes last: it leaves the
cluster with the head alone.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'sandcell[ray]'")

from tests.ray_cluster import Cluster, kill_node, local_cluster

pytestmark = pytest.mark.slow

SLOTS_PER_NODE = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with local_cluster(("head", "worker"), slots=SLOTS_PER_NODE) as started:
        yield started


def _write_tasks(path: Path, count: int, *, sleep_s: float, export: bool = False) -> list[str]:
    ids = []
    with path.open("w") as f:
        for i in range(count):
            ids.append(f"t{i}")
            code = f"import time\ntime.sleep({sleep_s})\nprint({i} * 3)"
            f.write(json.dumps({"id": f"t{i}", "code": code, "expected_stdout": str(i * 3)}) + "\n")
        if export:
            ids.append("art")
            code = "open('out.txt', 'w').write('made on a node')\nprint('ok')"
            line = {"id": "art", "code": code, "expected_stdout": "ok", "exports": ["out.txt"]}
            f.write(json.dumps(line) + "\n")
    return ids


def _batch_cmd(cluster: Cluster, tasks: Path, home: Path, concurrency: int = 4) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sandcell",
        "--home",
        str(home),
        "batch",
        str(tasks),
        "--ray",
        cluster.address,
        "--concurrency",
        str(concurrency),
        "--json",
    ]


def _lines(results: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in results.read_text().splitlines() if x.strip()]


def _most_at_once(lines: list[dict[str, object]]) -> int:
    """The most runs of ``lines`` that overlapped in time. Each run's interval is its program's
    wall time ending when its line was made: inside the time the task was in flight, so runs
    that overlap here were in flight together."""
    events = []
    for x in lines:
        end = dt.datetime.fromisoformat(str(x["finished_at"])).timestamp()
        wall_ms = x["wall_ms"]
        assert isinstance(wall_ms, int | float)
        events += [(end - wall_ms / 1000, 1), (end, -1)]
    most = now = 0
    for _, step in sorted(events):  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def _summary(stdout: str) -> dict[str, object]:
    last = [x for x in stdout.splitlines() if x.startswith("{")][-1]
    body: dict[str, object] = json.loads(last)
    return body


def _sandcell(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_batch_uses_every_node_keeps_records_there_and_returns_artifacts(
    cluster: Cluster, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    ids = _write_tasks(tasks, 8, sleep_s=0.5, export=True)
    driver_home = tmp_path / "driver-home"
    # More concurrency than the cluster's four slots: each node's slots must hold the line.
    proc = subprocess.run(
        _batch_cmd(cluster, tasks, driver_home, concurrency=8),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _lines(tmp_path / "tasks.results.jsonl")
    assert sorted(str(x["id"]) for x in lines) == sorted(ids)
    assert all(x["passed"] is True and x["outcome"] == "ok" for x in lines), lines

    homes = {str(h) for h in cluster.homes.values()}
    assert {str(x["node_home"]) for x in lines} == homes, "both nodes should have run tasks"
    node_of_home = {str(x["node_home"]): str(x["node_id"]) for x in lines}
    assert len(set(node_of_home.values())) == 2
    for home in homes:
        most = _most_at_once([x for x in lines if x["node_home"] == home])
        assert most <= SLOTS_PER_NODE, f"{most} runs at once on a node with {SLOTS_PER_NODE} slots"

    # Each run is recorded in the home of the node that ran it, and each node's chain verifies.
    for x in lines:
        shown = _sandcell("--home", str(x["node_home"]), "audit", "show", str(x["run_id"]))
        assert shown.returncode == 0, shown.stderr
    for home in cluster.homes.values():
        verified = _sandcell("--home", str(home), "audit", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "intact" in verified.stdout

    # The artifact came back into the driver's store, under its checked hash.
    (art,) = [x for x in lines if x["id"] == "art"]
    artifacts = art["artifacts"]
    assert isinstance(artifacts, list)
    (entry,) = artifacts
    sha = entry["sha256"]
    stored = driver_home / "artifacts" / sha[:2] / sha[2:]
    assert stored.read_bytes() == b"made on a node"
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha

    from sandcell.ray import task_index

    index = task_index(tmp_path / "tasks.results.jsonl")
    assert {k: v.run_id for k, v in index.items()} == {str(x["id"]): x["run_id"] for x in lines}

    summary = _summary(proc.stdout)
    ray_part = summary["ray"]
    assert isinstance(ray_part, dict)
    assert ray_part["rerun_after_node_loss"] == 0


def test_interrupted_driver_resumes_without_rerunning_finished_tasks(
    cluster: Cluster, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    ids = _write_tasks(tasks, 12, sleep_s=1.0)
    results = tmp_path / "tasks.results.jsonl"
    home = tmp_path / "driver-home"
    driver = subprocess.Popen(
        _batch_cmd(cluster, tasks, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        if results.exists() and len(_lines(results)) >= 2:
            break
        time.sleep(0.1)
    assert driver.poll() is None, "the batch ended before it could be interrupted"
    # SIGTERM rather than SIGINT: Ray's driver setup replaces that handler, the batch must not.
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 128 + signal.SIGTERM, err[-3000:]
    first = results.read_bytes()
    first_ids = [str(x["id"]) for x in _lines(results)]
    assert len(first_ids) == len(set(first_ids))
    assert 2 <= len(first_ids) < len(ids)

    proc = subprocess.run(
        _batch_cmd(cluster, tasks, home), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results.read_bytes().startswith(first), "lines of the first session changed"
    lines = _lines(results)
    assert Counter(str(x["id"]) for x in lines) == Counter(ids), "a task lost or written twice"
    assert all(x["passed"] is True for x in lines)
    summary = _summary(proc.stdout)
    assert summary["skipped"] == len(first_ids)
    assert summary["ran"] == len(ids) - len(first_ids)


def test_a_killed_driver_resumes_with_each_task_written_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    ids = _write_tasks(tasks, 10, sleep_s=1.0)
    results = tmp_path / "tasks.results.jsonl"
    home = tmp_path / "driver-home"
    driver = subprocess.Popen(
        _batch_cmd(cluster, tasks, home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        if results.exists() and len(_lines(results)) >= 2:
            break
        time.sleep(0.1)
    assert driver.poll() is None, "the batch ended before the driver could be killed"
    # No chance to clean up: Ray ends the driver's workers (and their sandboxes die with them).
    driver.kill()
    driver.wait(timeout=60)
    first = results.read_bytes()
    proc = subprocess.run(
        _batch_cmd(cluster, tasks, home), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results.read_bytes().startswith(first.rsplit(b"\n", 1)[0])
    lines = _lines(results)
    assert Counter(str(x["id"]) for x in lines) == Counter(ids), "a task lost or written twice"
    assert all(x["passed"] is True for x in lines)


def test_ray_api_runs_programs_from_tasks_and_a_dataset(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "ray_program.py"
    script.write_text(
        "import json, sys\n"
        "import ray\n"
        "import sandcell.ray as sr\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
        "refs = [sr.submit(f'print({i} + 1)') for i in range(3)]\n"
        "rows = ray.get(refs)\n"
        "out = {'tasks': rows}\n"
        "try:\n"
        "    import ray.data\n"
        "    import pyarrow  # noqa: F401\n"
        "except ImportError:\n"
        "    out['dataset'] = None\n"
        "else:\n"
        "    ds = ray.data.from_items([{'code': f'print({i} * 7)'} for i in range(4)])\n"
        "    mapped = ds.map_batches(sr.Programs, concurrency=1, batch_size=2,\n"
        "                            num_cpus=0, resources={'sandcell_slots': 1})\n"
        "    out['dataset'] = sorted(mapped.take_all(), key=lambda r: r['code'])\n"
        "print(json.dumps(out, default=str))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = out["tasks"]
    assert [r["stdout"] for r in rows] == ["1\n", "2\n", "3\n"]
    assert all(r["outcome"] == "ok" and r["run_id"] for r in rows)
    if out["dataset"] is None:
        pytest.skip(
            "pyarrow is not installed, so Ray Data cannot build a Dataset here: the test venv "
            "leaves it out because it is also the sandboxes' runtime (pyproject.toml, test extra)"
        )
    assert [r["stdout"] for r in out["dataset"]] == [f"{i * 7}\n" for i in range(4)]
    assert all(r["outcome"] == "ok" for r in out["dataset"])


def test_a_node_killed_mid_batch_loses_no_result(cluster: Cluster, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    ids = _write_tasks(tasks, 12, sleep_s=1.5)
    results = tmp_path / "tasks.results.jsonl"
    worker_home = str(cluster.homes["worker"])
    driver = subprocess.Popen(
        _batch_cmd(cluster, tasks, tmp_path / "driver-home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and driver.poll() is None:
        if results.exists() and any(x["node_home"] == worker_home for x in _lines(results)):
            break
        time.sleep(0.1)
    assert driver.poll() is None, "the batch ended before the worker node could be killed"
    # The worker node goes the way a crashed machine does: its raylet and every process of it.
    kill_node(cluster, "worker")
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    lines = _lines(results)
    assert Counter(str(x["id"]) for x in lines) == Counter(ids), "a task lost or written twice"
    assert all(x["passed"] is True for x in lines)
    summary = _summary(out)
    ray_part = summary["ray"]
    assert isinstance(ray_part, dict)
    assert ray_part["rerun_after_node_loss"] >= 1, "the killed node had no task in flight"
    on_worker = [x for x in lines if x["node_home"] == worker_home]
    assert 1 <= len(on_worker) < len(ids)
    # What the dead node recorded before it died still verifies.
    verified = _sandcell("--home", worker_home, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
