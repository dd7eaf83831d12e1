"""Benchmark: runs placed on a Ray cluster (``sandcell.cluster``), on a local cluster started here.

Usage::

    .venv/bin/python bench/bench_cluster.py [--runs 24] [--samples 40] [--json]

Three ``ray start`` nodes on loopback (one CPU and two ``sandcell_slots`` each, each with its own
sandcell home; ``tests/ray_cluster.py`` starts them), and this process as the replica: an
Executor whose runs a :class:`~sandcell.cluster.Cluster` places (policy, record and artifacts
here, the sandbox on a node's agent). Agents start with warm pools (``pool``, 3 per node).

- **Throughput**: ``--runs`` programs that each sleep 1 s, as many at once as the nodes have slots,
  placed on one node, then on all three; the ratio of runs per second (target: at least 2.5x).
- **Placement overhead**: a warm ``print(1)`` placed on the replica's own node, then on another
  node, interleaved, ``--samples`` each; the median of each and their difference (target: at
  most 10 ms). All nodes are on this machine, so "another node" crosses Ray's object transfer
  between two raylets over loopback, not a network: on real machines add the network's
  round trip. The same run on a local Executor (no cluster, the same warm pool) is shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ray_cluster import local_cluster  # noqa: E402

from sandcell.backends.warm import WarmConfig  # noqa: E402
from sandcell.cluster import Cluster  # noqa: E402
from sandcell.executor import Executor  # noqa: E402
from sandcell.spec import Outcome, RunRequest  # noqa: E402

SLOTS = 2
SLEEP = RunRequest(code="import time\ntime.sleep(1)\nprint('ok')")
WARM = RunRequest(code="print(1)")


def _throughput(ex: Executor, runs: int, concurrency: int) -> float:
    """Runs per second of ``runs`` sleep-bound runs, ``concurrency`` at once."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda _: ex.run(SLEEP), range(runs)))
    elapsed = time.monotonic() - t0
    bad = [r.reason for r in results if r.outcome is not Outcome.OK]
    if bad:
        raise SystemExit(f"runs failed: {bad[:3]}")
    return runs / elapsed


def _once_ms(ex: Executor) -> float:
    t0 = time.perf_counter()
    r = ex.run(WARM)
    ms = (time.perf_counter() - t0) * 1000
    if r.outcome is not Outcome.OK or r.start.mode == "cold":
        raise SystemExit(f"a warm run did not start warm: {r.outcome} {r.start.mode} {r.reason}")
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import ray

    home = Path(tempfile.mkdtemp(prefix="sandcell-bench-cluster-"))
    os.environ["SANDCELL_HOME"] = str(home / "local")
    warm = WarmConfig(mode="pool", pool_size=3)
    with local_cluster(("a", "b", "c"), slots=SLOTS, prefix="scbench-") as nodes:
        everyone = Cluster.connect(nodes.address, home=home / "replica", warm=warm)
        try:
            everyone.prepare("namespaces", "default")
            ids = sorted(r.node_id for r in everyone.reports())
            own = everyone.own_node_id
            other = next(i for i in ids if i != own)

            def on(only: set[str]) -> Cluster:
                return Cluster(ray, home=home / "replica", warm=warm, only_nodes=frozenset(only))

            one, mine, theirs = on({own}), on({own}), on({other})
            ex_all = Executor(home=home / "replica", cluster=everyone)
            ex_one = Executor(home=home / "replica", cluster=one)
            ex_own = Executor(home=home / "replica", cluster=mine)
            ex_other = Executor(home=home / "replica", cluster=theirs)
            local = Executor(home=home / "local", backend="namespaces", warm=warm)
            for ex in (ex_own, ex_other, local, ex_all):
                for _ in range(3):  # first runs: pools filled, imports done, agents hot
                    ex.run(WARM)

            rate_one = _throughput(ex_one, args.runs, SLOTS)
            rate_all = _throughput(ex_all, args.runs, SLOTS * len(ids))
            own_ms, other_ms, local_ms = [], [], []
            for _ in range(args.samples):
                own_ms.append(_once_ms(ex_own))
                other_ms.append(_once_ms(ex_other))
                local_ms.append(_once_ms(local))
            for ex in (ex_all, ex_one, ex_own, ex_other, local):
                ex.close()
            for c in (one, mine, theirs):
                c.close()
        finally:
            everyone.close()
    out = {
        "machine": {"cpus": os.cpu_count(), "nodes": 3, "slots_per_node": SLOTS},
        "throughput": {
            "runs": args.runs,
            "one_node_runs_per_s": round(rate_one, 3),
            "three_nodes_runs_per_s": round(rate_all, 3),
            "ratio": round(rate_all / rate_one, 2),
            "target_ratio": 2.5,
        },
        "placement": {
            "samples": args.samples,
            "own_node_median_ms": round(statistics.median(own_ms), 2),
            "other_node_median_ms": round(statistics.median(other_ms), 2),
            "difference_ms": round(statistics.median(other_ms) - statistics.median(own_ms), 2),
            "local_executor_median_ms": round(statistics.median(local_ms), 2),
            "target_difference_ms": 10.0,
        },
    }
    if args.json:
        print(json.dumps(out))
    else:
        t, p = out["throughput"], out["placement"]
        print(
            f"sleep-bound runs (1 s each, {args.runs}): one node {t['one_node_runs_per_s']}/s, "
            f"three nodes {t['three_nodes_runs_per_s']}/s: {t['ratio']}x (target >= 2.5x)"
        )
        print(
            f"warm print(1), median of {args.samples}: own node {p['own_node_median_ms']} ms, "
            f"other node {p['other_node_median_ms']} ms: +{p['difference_ms']} ms (target <= 10); "
            f"local executor {p['local_executor_median_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
