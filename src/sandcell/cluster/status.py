"""What ``sandcell cluster status`` shows: each node with sandcell slots, and its agent's report.

It only looks: a node whose agent no replica has started yet is shown without one (a replica
starts it on first use), never started from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sandcell.cluster.connect import NAMESPACE
from sandcell.cluster.fleet import NodeSpec, agent_name, lost_errors, sandcell_nodes
from sandcell.cluster.wire import NodeReport

_DESCRIBE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """A live node with slots, and what its agent reported (None: why in ``agent``)."""

    node: NodeSpec
    agent: str
    report: NodeReport | None

    def to_dict(self) -> dict[str, object]:
        return {
            "node_id": self.node.node_id,
            "address": self.node.address,
            "slots": self.node.slots,
            "declared_rungs": list(self.node.declared_rungs),
            "agent": self.agent,
            **(self.report.to_dict() if self.report is not None else {}),
        }


def cluster_status(ray: ModuleType) -> list[NodeStatus]:
    """One entry per live node offering ``sandcell_slots``."""
    nodes = sandcell_nodes(ray)
    calls: list[Any] = []
    for node in nodes:
        try:
            actor = ray.get_actor(agent_name(node.node_id), namespace=NAMESPACE)
        except ValueError:
            calls.append(None)
            continue
        calls.append(actor.describe.remote())
    rows = []
    for node, call in zip(nodes, calls, strict=True):
        if call is None:
            rows.append(
                NodeStatus(
                    node=node,
                    agent="not started (a replica starts it when it first places a run)",
                    report=None,
                )
            )
            continue
        try:
            report: NodeReport = ray.get(call, timeout=_DESCRIBE_TIMEOUT_S)
        except (*lost_errors(ray), ray.exceptions.GetTimeoutError) as exc:
            rows.append(
                NodeStatus(node=node, agent=f"not answering: {type(exc).__name__}", report=None)
            )
        else:
            rows.append(NodeStatus(node=node, agent="running", report=report))
    return rows


def render(rows: list[NodeStatus]) -> str:
    """The rows as text, one block per node."""
    if not rows:
        return "no live node offers sandcell_slots"
    out = []
    for row in rows:
        head = f"node {row.node.node_id}  {row.node.address}  slots {row.node.slots}"
        r = row.report
        if r is None:
            out.append(f"{head}\n  agent: {row.agent}")
            continue
        pools = (
            ", ".join(f"{p.rung}/{p.runtime} {p.mode} {p.ready}/{p.size} ready" for p in r.pools)
            or "none built yet"
        )
        out.append(
            f"{head}  free {r.free}  running {r.running}  queued {r.queued}  "
            f"sessions {r.sessions}\n"
            f"  host {r.hostname}  home {r.home}\n"
            f"  rungs: {', '.join(r.rungs) or 'none'}\n  pools: {pools}\n"
            f"  runtimes: {', '.join(r.runtimes) or 'none'}"
        )
    return "\n".join(out)


__all__ = ["NodeStatus", "cluster_status", "render"]
