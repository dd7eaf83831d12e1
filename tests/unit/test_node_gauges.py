"""The cluster's nodes as a replica's /metrics shows them (``sandcell_node_*`` gauges)."""

from __future__ import annotations

from sandcell.cluster.wire import NodeReport, PoolReport
from sandcell.service.core import node_gauges
from sandcell.service.metrics import Metrics


def _report(node: str, *, running: int, pools: tuple[PoolReport, ...] = ()) -> NodeReport:
    return NodeReport(
        node_id=node,
        hostname=f"host-{node}",
        home=f"/var/lib/sandcell-{node}",
        pid=100,
        rungs=("namespaces",),
        slots=4,
        running=running,
        queued=1,
        pools=pools,
        runtimes=("minimal",),
        store_id="s",
        sessions=2,
    )


def test_each_node_is_a_series_of_each_gauge() -> None:
    pool = PoolReport(rung="namespaces", runtime="minimal", mode="pool", ready=3, size=4)
    gauges = node_gauges([_report("n1", running=2, pools=(pool,)), _report("n2", running=0)])
    n1 = {"node": "n1", "host": "host-n1"}
    assert (n1, 4.0) in gauges["sandcell_node_slots"]
    assert (n1, 2.0) in gauges["sandcell_node_running"]
    assert ({"node": "n2", "host": "host-n2"}, 0.0) in gauges["sandcell_node_running"]
    assert gauges["sandcell_node_queued"] == [(n1, 1.0), ({"node": "n2", "host": "host-n2"}, 1.0)]
    assert (n1, 2.0) in gauges["sandcell_node_sessions"]
    assert gauges["sandcell_node_pool_ready"] == [
        ({**n1, "rung": "namespaces", "runtime": "minimal"}, 3.0)
    ]


def test_the_exposition_names_every_node() -> None:
    text = Metrics().render(lambda: node_gauges([_report("n1", running=1)]))
    assert 'sandcell_node_running{host="host-n1",node="n1"} 1' in text
    assert "# TYPE sandcell_node_slots gauge" in text
