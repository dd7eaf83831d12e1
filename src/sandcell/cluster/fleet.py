"""A replica's view of the cluster: one agent per node, what each advertises, and placement.

:class:`Cluster` finds the live nodes offering ``sandcell_slots`` (``ray.nodes()``), gets or
starts each node's agent (a named detached actor ``sandcell-node-<node id>`` in the ``sandcell``
namespace, pinned to its node: every replica reaches the same one), and asks each what it offers
(:class:`~sandcell.cluster.wire.NodeReport`) every ``refresh_s`` on a thread of its own, so that
placing a run costs no call to the cluster. A node whose agent or raylet is gone is dropped at
once (a run that meets it ends ``node lost``) and taken on again only when Ray shows it alive.

The head going away (its GCS port refusing connections; without GCS fault tolerance its nodes'
raylets and agents go with it) makes the cluster *unreachable*: every node is dropped, runs in
flight end ``node lost``, new runs are refused at once with IsolationUnavailable saying so, and
the refresh thread disconnects from Ray and connects again when a head answers at the same
address (a connection this Cluster made itself), starting agents anew on the nodes that join.

Placement (:meth:`Cluster.take`): among the nodes offering the rung, those with a free slot
first; among them, a node whose warm pool for the runtime has a start waiting; then the least
loaded (runs in flight over slots, this replica's count or the node's own report, whichever is
higher: other replicas' runs count too).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sandcell.artifacts import ArtifactStore, ExportLimits
from sandcell.backends.registry import BackendName
from sandcell.cluster.agent import RUNG_RESOURCE, NodeAgent
from sandcell.cluster.connect import NAMESPACE, connect, head_answers
from sandcell.cluster.store_id import store_identity
from sandcell.cluster.wire import NodeReport
from sandcell.errors import IsolationUnavailable
from sandcell.home import SHARED_DIR_ENV, bulk_dir
from sandcell.ray._ray import SLOTS
from sandcell.ray.nodes import no_nodes_hint

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig
    from sandcell.cluster.backend import ClusterBackend

log = logging.getLogger(__name__)

AGENT_PREFIX = "sandcell-node-"
START_TIMEOUT_S = 120.0
"""How long a node's agent may take to start (a worker process, the host probe)."""
PLACE_WAIT_S = 15.0
"""How long a run with no node to go to waits for agents that have not reported yet."""
CONTROL_CALLS = 8
"""Threads of an agent beside its runs: describe, cancel, prepare."""
CALL_TIMEOUT_S = 30.0
"""How long a call to an agent outside a run (a cancel, a session's end) may take."""
HEAD_PROBE_S = 2.0
"""How long the head's GCS port may take to accept a connection before the head counts as
gone (on a cluster's network, milliseconds)."""
DISCONNECT_WAIT_S = 30.0
"""How long a lost cluster's runs in flight get to end before this replica leaves it."""
QUEUE_FACTOR = 8
"""Runs an agent takes per slot (the rest wait for a slot there); more wait in Ray's queue."""


def agent_name(node_id: str) -> str:
    return f"{AGENT_PREFIX}{node_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A live node with sandcell slots, as ``ray.nodes()`` says."""

    node_id: str
    address: str
    slots: int
    declared_rungs: tuple[str, ...]


def sandcell_nodes(ray: ModuleType) -> tuple[NodeSpec, ...]:
    """The live nodes offering at least one ``sandcell_slots``, with the rungs they declare."""
    found = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        resources = info.get("Resources", {})
        slots = int(float(resources.get(SLOTS, 0)))
        if slots < 1:
            continue
        declared = tuple(
            sorted(k.removeprefix(RUNG_RESOURCE) for k in resources if k.startswith(RUNG_RESOURCE))
        )
        found.append(
            NodeSpec(
                node_id=str(info["NodeID"]),
                address=str(info.get("NodeManagerAddress", "")),
                slots=slots,
                declared_rungs=declared,
            )
        )
    return tuple(found)


@dataclass(kw_only=True)
class Member:
    """A node's agent as this replica sees it (guarded by the cluster's lock)."""

    spec: NodeSpec
    actor: Any
    report: NodeReport | None = None
    pending: Any = None
    """The describe call in flight, if any."""
    in_flight: int = 0
    """This replica's runs on the node now."""
    sent: int = 0
    """This replica's runs sent to the node in all (spreads ties)."""
    alive: bool = True
    started: float = field(default_factory=time.monotonic)

    @property
    def node_id(self) -> str:
        return self.spec.node_id

    def load(self) -> int:
        reported = self.report.running + self.report.queued if self.report else 0
        return max(self.in_flight, reported)

    def warm_for(self, rung: str, runtime: str) -> bool:
        return self.report is not None and any(
            p.rung == rung and p.runtime == runtime and p.ready > 0 for p in self.report.pools
        )


def choose(
    members: Sequence[Member], rung: str, runtime: str, *, only: str | None = None
) -> Member | None:
    """The member a run on ``rung`` in ``runtime`` goes to (see the module), None when no live
    one offers the rung; ``only``: that node id alone may take it."""
    fit = [
        m
        for m in members
        if m.alive
        and m.report is not None
        and rung in m.report.rungs
        and (only is None or m.node_id == only)
    ]
    if not fit:
        return None
    return min(
        fit,
        key=lambda m: (
            m.load() >= m.spec.slots,
            not m.warm_for(rung, runtime),
            m.load() / m.spec.slots,
            m.sent / m.spec.slots,
        ),
    )


class Cluster:
    """The nodes of a Ray cluster this process places runs on; thread-safe. Build it with
    :meth:`connect` (or on an already connected ``ray``), close it when done."""

    def __init__(
        self,
        ray: ModuleType,
        *,
        home: Path,
        warm: WarmConfig | None = None,
        export_limits: ExportLimits | None = None,
        only_nodes: frozenset[str] | None = None,
        refresh_s: float = 1.0,
        owns_connection: bool = False,
        address: str | None = None,
    ) -> None:
        """``home``: this replica's home (its artifact store receives what nodes export).
        ``warm``: the warm starts of an agent this replica starts (an agent keeps the config it
        was started with). ``only_nodes``: place only on these node ids (benchmarks, draining).
        ``address``: what ``ray`` was connected with (by :meth:`connect`, with
        ``owns_connection``): the cluster is connected to again there after its head was lost.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        self.store = ArtifactStore(bulk_dir(home) / "artifacts")
        self.store_id = store_identity(self.store.root)
        self.shared = _shared_dir()
        self.export_limits = export_limits or ExportLimits()
        self.warm = warm
        self.only_nodes = only_nodes
        self.own_node_id = _own_node(ray)
        self._affinity = NodeAffinitySchedulingStrategy
        self._remote = ray.remote(NodeAgent)
        self._owns_connection = owns_connection
        self._address = address if owns_connection else None
        self._head = _head_address(ray, self._address)
        self.unreachable: str | None = None
        """Why the cluster cannot be reached now (its head is gone), or None."""
        self._disconnected = False
        self._active = 0
        """This replica's runs on any node now (the reconnection waits for them to leave)."""
        self._lock = threading.Lock()
        self._members: dict[str, Member] = {}
        self._stop = threading.Event()
        self.on_placed: Callable[[str, str], None] | None = None
        """Told ``(run id, node id)`` once a run is placed (a replica notes the node in its
        runs in flight, so that a sweep after its death cancels the run there)."""
        self.refresh(wait_s=START_TIMEOUT_S)
        self._thread = threading.Thread(
            target=self._refresh_loop, args=(refresh_s,), name="sandcell-cluster", daemon=True
        )
        self._thread.start()

    @classmethod
    def connect(cls, address: str, *, home: Path, **options: Any) -> Cluster:
        """Connect to the cluster at ``address`` (:func:`sandcell.cluster.connect.connect`)."""
        ray, connected = connect(address)
        try:
            return cls(ray, home=home, owns_connection=connected, address=address, **options)
        except BaseException:
            if connected:
                ray.shutdown()
            raise

    def backend(self, rung: BackendName, runtime: str) -> ClusterBackend:
        """The backend of runs on ``rung`` in ``runtime``, placed on this cluster's nodes."""
        from sandcell.cluster.backend import ClusterBackend

        return ClusterBackend(self, rung, runtime)

    # -- nodes ---------------------------------------------------------------------------------

    def refresh(self, *, wait_s: float = 0.0) -> None:
        """Take on new nodes, drop gone ones, and renew what each agent reports; waits up to
        ``wait_s`` for agents that have not reported yet. Nothing while the cluster is
        unreachable (the refresh thread connects again); a head that stopped answering makes
        it so."""
        if self.unreachable is not None:
            return
        if self._head is not None:
            why = head_answers(self._head, timeout_s=HEAD_PROBE_S)
            if why is not None:
                self._fall(why)
                return
        live = {n.node_id: n for n in sandcell_nodes(self.ray)}
        if self.only_nodes is not None:
            live = {k: v for k, v in live.items() if k in self.only_nodes}
        with self._lock:
            for node_id, member in list(self._members.items()):
                if node_id not in live or not member.alive:
                    del self._members[node_id]
            new = [n for n in live.values() if n.node_id not in self._members]
        for spec in new:
            member = Member(spec=spec, actor=self._agent(spec))
            with self._lock:
                self._members[spec.node_id] = member
        with self._lock:
            members = list(self._members.values())
            for m in members:
                if m.pending is None:
                    m.pending = m.actor.describe.remote()
            pending = {m.pending: m for m in members}
        deadline = time.monotonic() + wait_s
        while pending:
            ready, _ = self.ray.wait(
                list(pending),
                num_returns=len(pending),
                timeout=max(0.0, deadline - time.monotonic()),
            )
            for ref in ready:
                self._reported(pending.pop(ref), ref)
            if not ready or time.monotonic() >= deadline:
                break

    def _agent(self, spec: NodeSpec) -> Any:
        return self._remote.options(
            name=agent_name(spec.node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=spec.slots * QUEUE_FACTOR + CONTROL_CALLS,
            scheduling_strategy=self._affinity(node_id=spec.node_id, soft=False),
        ).remote(slots=spec.slots, declared_rungs=spec.declared_rungs, warm=self.warm)

    def _reported(self, member: Member, ref: Any) -> None:
        try:
            report: NodeReport = self.ray.get(ref)
        except Exception as exc:  # a dead agent or node, or an agent that could not start
            log.warning("sandcell agent of node %s is gone: %s", member.node_id, _last_line(exc))
            self.lost(member)
            return
        with self._lock:
            member.report = report
            member.pending = None

    def lost(self, member: Member) -> None:
        """Place nothing more on ``member``'s node until Ray shows its agent alive again."""
        with self._lock:
            member.alive = False
            if self._members.get(member.node_id) is member:
                del self._members[member.node_id]

    def _fall(self, why: str) -> None:
        """The head is gone: drop every node (runs in flight there end ``node lost``, new
        ones are refused) until the refresh thread has connected again."""
        with self._lock:
            if self.unreachable is not None:
                return
            self.unreachable = f"the Ray cluster's head at {self._head} is unreachable ({why})"
            for member in self._members.values():
                member.alive = False
            self._members.clear()
        log.warning("sandcell cluster: %s; connecting again once it answers", self.unreachable)

    def _reconnect(self) -> None:
        """On the refresh thread while unreachable: leave the lost cluster (once this
        replica's runs there have ended), then join the one answering at the same address
        again; agents start anew on its nodes as they join."""
        if self._address is None or self._head is None:
            return  # a connection made by the caller is the caller's to make again
        if not self._disconnected:
            deadline = time.monotonic() + DISCONNECT_WAIT_S
            while self._active > 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # each run in flight sees the cluster unreachable and ends
            self.ray.shutdown()
            self._disconnected = True
        if head_answers(self._head, timeout_s=HEAD_PROBE_S) is not None:
            return
        ray, _ = connect(self._address)
        self.ray = ray
        self._remote = ray.remote(NodeAgent)
        self.own_node_id = _own_node(ray)
        self._head = _head_address(ray, self._address) or self._head
        self._disconnected = False
        with self._lock:
            self.unreachable = None
        log.warning("sandcell cluster: connected again to the head at %s", self._head)
        self.refresh()

    def members(self) -> list[Member]:
        with self._lock:
            return [m for m in self._members.values() if m.alive and m.report is not None]

    def reports(self) -> list[NodeReport]:
        return [m.report for m in self.members() if m.report is not None]

    def _refresh_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                if self.unreachable is not None:
                    self._reconnect()
                else:
                    self.refresh()
            except Exception as exc:  # the next round tries again; placement keeps the last view
                log.warning("sandcell cluster refresh failed: %s", _last_line(exc))

    # -- placement -----------------------------------------------------------------------------

    def take(self, rung: str, runtime: str, *, own_node: bool = False) -> Member:
        """The node a run on ``rung`` in ``runtime`` goes to, counted in flight there until
        :meth:`give_back`; ``own_node``: only this replica's own node (a run whose sockets
        are on this host). Raises IsolationUnavailable when no node can take it."""
        self._check_reachable()
        member = self._choose(rung, runtime, own_node)
        if member is None:
            # A node may have joined (or this replica's view be stale): look again, once, for
            # as long as a new agent takes to start, not as long as a dying node takes to go.
            self.refresh(wait_s=PLACE_WAIT_S)
            member = self._choose(rung, runtime, own_node)
        if member is None:
            self._check_reachable()
            raise self._unavailable(rung, own_node)
        return member

    def _check_reachable(self) -> None:
        why = self.unreachable
        if why is not None:
            raise IsolationUnavailable(
                "cluster",
                f"{why}: runs wait for it to come back, this replica connects again by itself",
                "restart the Ray head at the same address (and its nodes), or try again later",
            )

    def _choose(self, rung: str, runtime: str, own_node: bool) -> Member | None:
        with self._lock:
            best = choose(
                list(self._members.values()),
                rung,
                runtime,
                only=self.own_node_id if own_node else None,
            )
            if best is not None:
                best.in_flight += 1
                best.sent += 1
                self._active += 1
            return best

    def placed_run(self, run_id: str, node_id: str) -> None:
        """Tell :attr:`on_placed` that ``run_id`` went to ``node_id``; a failure of it is
        logged, never the run's (the note only helps a sweep find the node)."""
        hook = self.on_placed
        if hook is None:
            return
        try:
            hook(run_id, node_id)
        except Exception as exc:
            log.warning("run %s placed on node %s: not noted: %s", run_id, node_id, exc)

    def give_back(self, member: Member) -> None:
        with self._lock:
            member.in_flight -= 1
            self._active -= 1

    def _unavailable(self, rung: str, own_node: bool) -> IsolationUnavailable:
        if own_node:
            return IsolationUnavailable(
                rung,
                "this run needs this replica's host (its profile reaches outside, through an "
                "egress proxy or tool gateway whose sockets live in this replica's process, "
                "or it comes back from a state outside the shared directory), and this "
                f"replica's own node ({self.own_node_id}) runs no sandcell agent offering {rung}",
                f"run the replica on a node of the cluster that offers {rung} (with "
                f"{SLOTS}), or give such runs a profile without network or tools",
            )
        members = self.members()
        if not members:
            return IsolationUnavailable("cluster", no_nodes_hint(), f"start nodes with {SLOTS}")
        offered = sorted({r for m in members for r in (m.report.rungs if m.report else ())})
        return IsolationUnavailable(
            rung,
            f"no live node of the cluster offers it (offered: {', '.join(offered) or 'none'})",
            f"add a node that can run {rung} (sandcell doctor there), or choose another rung",
        )

    @contextlib.contextmanager
    def placed(self, rung: str, runtime: str, *, own_node: bool = False) -> Iterator[Member]:
        member = self.take(rung, runtime, own_node=own_node)
        try:
            yield member
        finally:
            self.give_back(member)

    def prepare(self, rung: str, runtime: str) -> list[NodeReport]:
        """Build ``rung`` in ``runtime`` on every node offering it (warm pools fill now)."""
        refs = [
            m.actor.prepare.remote(rung, runtime)
            for m in self.members()
            if m.report is not None and rung in m.report.rungs
        ]
        reports: list[NodeReport] = self.ray.get(refs, timeout=START_TIMEOUT_S)
        self.refresh(wait_s=START_TIMEOUT_S)
        return reports

    # -- what a dead replica left -------------------------------------------------------------

    def cancel_run(self, run_id: str, reason: str, *, node: str | None = None) -> bool:
        """Stop the run ``run_id`` that another replica sent (it died): on ``node`` when its
        node is known, else on every live node (an agent without it answers False). Whether
        an agent had it."""
        members = self.members()
        if node is not None and any(m.node_id == node for m in members):
            members = [m for m in members if m.node_id == node]
        refs = [m.actor.cancel.remote(run_id, reason) for m in members]
        return any(self._answers(refs))

    def end_session(self, node_id: str, session_id: str) -> bool:
        """End the sandbox of session ``session_id`` on node ``node_id`` (its replica died);
        whether the node had it. A node that is gone took the sandbox with it."""
        member = next((m for m in self.members() if m.node_id == node_id), None)
        if member is None:
            return False
        return any(self._answers([member.actor.session_end.remote(session_id)]))

    def _answers(self, refs: list[Any]) -> list[bool]:
        """What each call answered; False for an agent that is gone or does not answer in time."""
        found = []
        for ref in refs:
            try:
                found.append(bool(self.ray.get(ref, timeout=CALL_TIMEOUT_S)))
            except Exception as exc:  # a gone agent has nothing to stop or end
                log.warning("sandcell agent did not answer: %s", _last_line(exc))
                found.append(False)
        return found

    def close(self) -> None:
        """Stop watching the cluster (the agents stay: other replicas use them)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._owns_connection:
            self.ray.shutdown()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _own_node(ray: ModuleType) -> str:
    """The node this process runs on; none ("") through Ray Client, whose driver runs on the
    head: that node is not this host, and a run needing this host must not go there."""
    from ray.util.client import ray as client

    through_client: Callable[[], bool] = client.is_connected
    if through_client():
        return ""
    return str(ray.get_runtime_context().get_node_id())


def _head_address(ray: ModuleType, address: str | None) -> str | None:
    """HOST:PORT of the cluster's head, to be probed: ``address`` as given when it is one (the
    address the operator chose, which reaches it), the GCS address Ray reports for ``auto``.
    None (no probe) through Ray Client, whose server Ray watches itself, and for a connection
    the caller made (``address`` None): losing it is the caller's to handle."""
    from ray.util.client import ray as client

    through_client: Callable[[], bool] = client.is_connected
    if address is None or through_client() or address.startswith("ray://"):
        return None
    if address != "auto":
        return address
    gcs: str = ray.get_runtime_context().gcs_address
    return gcs or None


def _shared_dir() -> Path | None:
    import os

    value = os.environ.get(SHARED_DIR_ENV)
    return Path(value).expanduser() if value else None


def _last_line(exc: BaseException) -> str:
    lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
    return " | ".join(lines[-2:])[-400:] or type(exc).__name__


def lost_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    """What Ray raises when a call's actor, worker or node is gone."""
    e = ray.exceptions
    return (e.RayActorError, e.WorkerCrashedError, e.ObjectLostError, e.NodeDiedError)


__all__ = [
    "AGENT_PREFIX",
    "Cluster",
    "Member",
    "NodeSpec",
    "agent_name",
    "choose",
    "lost_errors",
    "sandcell_nodes",
]
