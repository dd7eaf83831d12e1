"""sandcell's runs placed on the nodes of a Ray cluster (docs/cluster.md, "Nodes and placement").

Ray is an optional extra (``pip install 'sandcell[ray]'``); nothing here imports it until a
cluster is connected.

- :class:`~sandcell.cluster.fleet.Cluster`: a replica's view of the cluster (one agent per node,
  what each offers, placement); ``Cluster.connect(address, home=...)``.
- :class:`~sandcell.cluster.backend.ClusterBackend`: a Backend of one rung whose runs go to the
  nodes; an Executor gets them with ``Executor(cluster=cluster)`` (each run's rung is placed).
- :class:`~sandcell.cluster.agent.NodeAgent`: the per-node actor holding the node's backends.
"""

from __future__ import annotations

from sandcell.cluster.backend import ClusterBackend
from sandcell.cluster.fleet import Cluster
from sandcell.cluster.wire import NodeReport

__all__ = ["Cluster", "ClusterBackend", "NodeReport"]
