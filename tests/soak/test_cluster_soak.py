"""A CI-sized cluster soak: bench/soak_cluster.py with a small count, all three faults (a node
killed, a replica restarted, PostgreSQL restarted) and its books (what each check means is in
that module)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.pg_server import unavailable_reason

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUNS = 150
CONCURRENCY = 4


@pytest.fixture(scope="module")
def soak_cluster(soak: ModuleType) -> ModuleType:
    """bench/soak_cluster.py as a module (``soak``: root, or the soak tests skip)."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'sandcell[ray]'")
    pytest.importorskip("uvicorn", reason="the service extra is not installed")
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    name = "sandcell_bench_soak_cluster"
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "soak_cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_cluster_soak_balances_its_books(
    soak_cluster: ModuleType, private_tmp: Path, tmp_path: Path
) -> None:
    figures = soak_cluster.soak_cluster(tmp_path / "root", RUNS, CONCURRENCY)
    print(figures)
    assert figures["problems"] == []
    assert figures["requests"] == figures["answers"] == RUNS
    # Every answer is a run with its one record (a request sent again has only its new one).
    assert figures["records"] == RUNS
    assert figures["chain_ok"] is True
    left = figures["leftovers"]
    assert left == {key: [] for key in left}
    assert figures["agents_closed"] == 2  # the two live nodes' (the killed one's went with it)
    assert figures["max_overlap_of_records"] <= figures["max_concurrent"]
    assert set(figures["kinds"]) == {k.name for k in soak_cluster.KINDS}
    faults = " | ".join(figures["faults"])
    for done in ("node c killed", "B answers again", "restart postgres: up again"):
        assert done in faults, faults
    # Only gross growth, and only for the replica that ran the whole load (B was restarted):
    # the first sample includes warm-up, so the middle is compared with the end.
    samples = dict(figures["rss_kib"])
    (a,) = set(samples["rss after warm-up"]) & set(samples["rss middle"]) & set(samples["end"])
    middle, end = samples["rss middle"][a], samples["end"][a]
    assert middle > 0 and end - middle <= max(64 * 1024, middle // 2), figures["rss_kib"]
