"""The nodes of a Ray cluster that run sandboxes: those offering the ``sandcell_slots`` resource.

A node says how many sandboxes it runs at once when it joins the cluster
(``ray start --resources='{"sandcell_slots": 4}'``); that figure is Ray's own resource accounting,
and the batch never has more tasks in flight on a node than it. A node without the resource is
not given sandcell work.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from sandcell.ray._ray import SLOTS


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A live node with sandcell slots."""

    node_id: str
    address: str
    slots: int


def sandcell_nodes(ray: ModuleType) -> tuple[Node, ...]:
    """The live nodes of the connected cluster that offer at least one sandcell slot."""
    found: list[Node] = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        slots = int(float(info.get("Resources", {}).get(SLOTS, 0)))
        if slots >= 1:
            found.append(
                Node(
                    node_id=str(info["NodeID"]),
                    address=str(info.get("NodeManagerAddress", "")),
                    slots=slots,
                )
            )
    return tuple(found)


def no_nodes_hint() -> str:
    return (
        f"no live node of the Ray cluster offers the {SLOTS!r} resource; start each node that "
        f"runs sandboxes with it, e.g. ray start --head --resources='{{\"{SLOTS}\": 4}}' "
        "(the number: sandboxes the node runs at once)"
    )


__all__ = ["Node", "no_nodes_hint", "sandcell_nodes"]
