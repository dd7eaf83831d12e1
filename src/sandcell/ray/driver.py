"""``sandcell batch --ray``: the tasks of a batch run by one sandcell worker per Ray node.

The driver (the process that runs ``sandcell batch``) is the only writer of the results file, and
it writes it exactly as a local batch does (:class:`~sandcell.batch.results.ResultsFile`): one
durable line per finished task, and the same resume rules; each line also names the node
(``node_id``, ``node_home``) whose record holds its ``run_id``, so the file is the index from
task to node and run.

Scheduling: one worker actor per node that offers ``sandcell_slots``; the actor reserves all of
its node's slots (so a second batch on the same cluster waits rather than overloading the node),
and the driver never has more tasks in flight on a node than its slots, nor more in all than
``concurrency``. Ray never retries a task by itself (that could run it twice): when a node or its
worker dies, the tasks it had in flight go back to the front of the queue and run on another
node; a task whose line is written is never run again. Artifacts come back as bytes and are put
into the driver's artifact store after their SHA-256 is checked.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sandcell.artifacts import ArtifactStore
from sandcell.batch.results import Recorded, ResultsFile
from sandcell.batch.runner import BatchProgress, BatchSummary, ProgressCallback, refuse_stale
from sandcell.batch.tasks import Task
from sandcell.errors import ConfigError, InfraError
from sandcell.home import bulk_dir
from sandcell.ray._ray import SLOTS, import_ray
from sandcell.ray.nodes import Node, no_nodes_hint, sandcell_nodes
from sandcell.ray.worker import NodeInfo, NodeWorker, TaskOutput

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig
    from sandcell.policy.profiles import Profile

_START_TIMEOUT_S = 120.0
"""How long a node's worker may take to start (its slots may be held by another batch)."""
_STOP_GRACE_S = 15.0
_PROBE_TIMEOUT_S = 5.0
"""How long an interrupted batch waits for the runs it cancelled to return."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RaySummary:
    """How a batch on Ray ended: the local batch's summary, plus the nodes and the reruns."""

    batch: BatchSummary
    nodes: tuple[NodeInfo, ...]
    """The nodes whose workers ran tasks in this session."""
    rerun_after_loss: int
    """Tasks sent again to another node because the node running them was lost."""

    def to_dict(self) -> dict[str, object]:
        return {
            **self.batch.to_dict(),
            "ray": {
                "nodes": [
                    {"node_id": n.node_id, "hostname": n.hostname, "home": n.home}
                    for n in self.nodes
                ],
                "rerun_after_node_loss": self.rerun_after_loss,
            },
        }


class _Member:
    """A node's worker as the driver sees it."""

    def __init__(self, node: Node, actor: Any, info: NodeInfo) -> None:
        self.node = node
        self.actor = actor
        self.info = info
        self.in_flight = 0
        self.alive = True


def _lost_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    """What ``ray.get`` raises when a task's node or worker is gone (the task may not have run)."""
    e = ray.exceptions
    return (e.RayActorError, e.WorkerCrashedError, e.ObjectLostError, e.NodeDiedError)


def _last_lines(text: str, keep: int = 3) -> str:
    """The end of a Ray error (where the cause is), not its whole traceback."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-keep:])[-600:]


class _Fleet:
    """The workers, one per node with sandcell slots; new nodes are taken on when all are lost."""

    def __init__(
        self,
        ray: ModuleType,
        *,
        profile: Profile,
        backend: str | None,
        warm: WarmConfig | None,
        pool_size_given: bool,
    ) -> None:
        self.ray = ray
        self.profile = profile
        self.backend = backend
        self.warm = warm
        self.pool_size_given = pool_size_given
        self.members: dict[str, _Member] = {}
        self.lost: set[str] = set()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._affinity = NodeAffinitySchedulingStrategy
        self._remote = ray.remote(NodeWorker)

    def grow(self) -> None:
        """Start a worker on every live node with slots that has none (and was never lost)."""
        new = [
            n
            for n in sandcell_nodes(self.ray)
            if n.node_id not in self.members and n.node_id not in self.lost
        ]
        if not new and not self.alive():
            raise InfraError(no_nodes_hint())
        starting = []
        failures: list[str] = []
        for node in new:
            warm = self.warm
            if warm is not None and warm.mode == "pool" and not self.pool_size_given:
                # One waiting sandbox per slot plus one, as a local batch has per worker.
                warm = replace(warm, pool_size=node.slots + 1)
            actor = self._remote.options(
                num_cpus=0,
                resources={SLOTS: node.slots},
                # The slots' runs, plus room for cancel and close calls beside them.
                max_concurrency=node.slots + 2,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=self._affinity(node_id=node.node_id, soft=False),
            ).remote(profile=self.profile, backend=self.backend, warm=warm)
            starting.append((node, actor, actor.describe.remote()))
        for node, actor, ref in starting:
            try:
                info = self.ray.get(ref, timeout=_START_TIMEOUT_S)
            except self.ray.exceptions.GetTimeoutError:
                self.ray.kill(actor)
                raise InfraError(
                    f"the sandcell worker on node {node.node_id} did not start within "
                    f"{_START_TIMEOUT_S:.0f} s; its {SLOTS} may be held by another batch on the "
                    "cluster (wait for it), or the node is overloaded"
                ) from None
            except self.ray.exceptions.RayTaskError as exc:
                # The worker's Executor could not start there (a layer missing on that node):
                # that is the node's problem to fix, said as sandcell says it.
                raise exc.as_instanceof_cause() from None
            except _lost_errors(self.ray) as exc:
                # The node went away, or the worker's own start failed there (its Executor
                # raised): either way no task goes to it.
                self.lost.add(node.node_id)
                failures.append(f"node {node.node_id}: {_last_lines(str(exc))}")
                continue
            self.members[node.node_id] = _Member(node, actor, info)
        if not self.alive():
            if failures:
                raise InfraError(
                    f"the sandcell worker could not start on any node with {SLOTS}; "
                    + "; ".join(failures[:3])
                )
            raise InfraError(no_nodes_hint())

    def alive(self) -> list[_Member]:
        return [m for m in self.members.values() if m.alive]

    def pick(self) -> _Member | None:
        """The live worker with a free slot and the fewest tasks in flight."""
        free = [m for m in self.alive() if m.in_flight < m.node.slots]
        return min(free, key=lambda m: m.in_flight / m.node.slots) if free else None

    def mark_lost(self, member: _Member) -> None:
        member.alive = False
        self.lost.add(member.node.node_id)

    def cancel_all(self, reason: str) -> None:
        refs = [m.actor.cancel_all.remote(reason) for m in self.alive()]
        self.ray.wait(refs, num_returns=len(refs), timeout=_STOP_GRACE_S)

    def close(self) -> None:
        refs = [m.actor.close.remote() for m in self.alive()]
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=_STOP_GRACE_S)
        for m in self.members.values():
            # An actor gone with its node cannot be killed again; nothing else to do for it.
            with contextlib.suppress(Exception):
                self.ray.kill(m.actor)


def _store_artifacts(store: ArtifactStore, out: TaskOutput) -> None:
    """Put the task's artifacts into the driver's store, each checked against its SHA-256."""
    what = f"task {out.line.get('id')!r}"
    store.put_arrived(out.artifacts, what=what, fix="; rerun the batch to resume")


def _connect_hint(address: str, why: str) -> InfraError:
    return InfraError(
        f"cannot connect to the Ray cluster at {address!r}: {why.rstrip('.')}; start one with "
        f"ray start --head --resources='{{\"{SLOTS}\": 4}}', or pass its address (HOST:PORT) "
        "to --ray"
    )


def _probe(address: str) -> None:
    """Fail at once for an address where nothing listens: Ray itself retries for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--ray {address!r}: give 'auto' or HOST:PORT of the cluster's head")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise _connect_hint(address, exc.strerror or str(exc)) from None


def connect(ray: ModuleType, address: str) -> bool:
    """Connect to the cluster at ``address`` (``auto``: the one started on this machine).

    Returns True when this call connected (and so the caller disconnects at its end)."""
    if ray.is_initialized():
        return False
    if address != "auto":
        _probe(address)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _connect_hint(address, str(exc)) from None
    finally:
        # ray.init puts in a SIGTERM handler that exits at once; the caller's (the batch's own,
        # which stops it cleanly and resumably) must stay.
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return True


def run_batch_on_ray(
    tasks: Sequence[Task],
    results_path: Path,
    *,
    address: str,
    profile: Profile,
    home: Path,
    concurrency: int,
    backend: str | None = None,
    warm: WarmConfig | None = None,
    pool_size_given: bool = False,
    restart: bool = False,
    stop: threading.Event | None = None,
    on_progress: ProgressCallback | None = None,
) -> RaySummary:
    """Run every task without a result line in ``results_path`` on the cluster; see the module.

    ``home``: the driver's data directory, whose artifact store receives the artifacts.
    Raises what stopped the batch when no task could be run (no node with slots, a worker that
    cannot start); the lines written until then stay, and the same call resumes.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    ray = import_ray()
    stop = stop or threading.Event()
    store = ArtifactStore(bulk_dir(home) / "artifacts")
    connected = connect(ray, address)
    try:
        with ResultsFile(results_path, restart=restart) as results:
            refuse_stale(tasks, results)
            fleet = _Fleet(
                ray, profile=profile, backend=backend, warm=warm, pool_size_given=pool_size_given
            )
            try:
                return _drive(
                    ray,
                    fleet,
                    tasks=tasks,
                    results=results,
                    store=store,
                    concurrency=concurrency,
                    stop=stop,
                    on_progress=on_progress,
                )
            finally:
                fleet.close()
    finally:
        if connected:
            ray.shutdown()


def _drive(
    ray: ModuleType,
    fleet: _Fleet,
    *,
    tasks: Sequence[Task],
    results: ResultsFile,
    store: ArtifactStore,
    concurrency: int,
    stop: threading.Event,
    on_progress: ProgressCallback | None,
) -> RaySummary:
    verdicts: dict[str, Recorded] = {
        t.id: results.recorded[t.id] for t in tasks if t.id in results.recorded
    }
    skipped = len(verdicts)
    passed = sum(1 for v in verdicts.values() if v.passed)
    pending = deque(t for t in tasks if t.id not in verdicts)
    in_flight: dict[Any, tuple[Task, _Member]] = {}
    starts: Counter[str] = Counter()
    used: dict[str, NodeInfo] = {}
    ran = rerun = 0
    t0 = time.monotonic()
    lost = _lost_errors(ray)

    def progress() -> BatchProgress:
        return BatchProgress(
            total=len(tasks),
            done=len(verdicts),
            passed=passed,
            skipped=skipped,
            ran=ran,
            elapsed_s=time.monotonic() - t0,
        )

    if on_progress is not None and skipped:
        on_progress(progress())
    if pending:
        fleet.grow()
    try:
        while (pending or in_flight) and not stop.is_set():
            while pending and len(in_flight) < concurrency:
                member = fleet.pick()
                if member is None:
                    break
                task = pending.popleft()
                in_flight[member.actor.run.remote(task)] = (task, member)
                member.in_flight += 1
            if not in_flight:
                fleet.grow()  # every worker was lost: take on the nodes live now, or raise
                continue
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.2)
            for ref in ready:
                task, member = in_flight.pop(ref)
                member.in_flight -= 1
                try:
                    out: TaskOutput = ray.get(ref)
                except lost:
                    # The node (or its worker) died with the task: it runs again elsewhere,
                    # first in line. Nothing of it was written.
                    fleet.mark_lost(member)
                    pending.appendleft(task)
                    rerun += 1
                    continue
                except ray.exceptions.RayTaskError as exc:
                    # The worker could not attempt the run (a host layer gone, a full disk): the
                    # batch stops as a local batch does.
                    raise exc.as_instanceof_cause() from None
                if stop.is_set():
                    break  # finished as the interrupt came: the interrupted runs are not kept
                _store_artifacts(store, out)
                line = {
                    **out.line,
                    "node_id": member.info.node_id,
                    "node_hostname": member.info.hostname,
                    "node_home": member.info.home,
                }
                results.append(line)
                verdict = Recorded.of(line)
                verdicts[task.id] = verdict
                passed += verdict.passed
                ran += 1
                used[member.info.node_id] = member.info
                if isinstance(line.get("start"), str):
                    starts[str(line["start"])] += 1
                if on_progress is not None:
                    on_progress(progress())
    except KeyboardInterrupt:
        stop.set()
        fleet.cancel_all("the batch was interrupted")
        raise
    if stop.is_set() and in_flight:
        fleet.cancel_all("the batch was interrupted")
        ray.wait(list(in_flight), num_returns=len(in_flight), timeout=_STOP_GRACE_S)
    p = progress()
    done = [(t.id, verdicts[t.id]) for t in tasks if t.id in verdicts]
    summary = BatchSummary(
        progress=p,
        outcomes=dict(Counter(v.outcome for _, v in done)),
        failed_ids=tuple(i for i, v in done if not v.passed),
        interrupted=stop.is_set() and p.done < p.total,
        truncated_line=results.truncated_line,
        starts=dict(starts),
    )
    return RaySummary(batch=summary, nodes=tuple(used.values()), rerun_after_loss=rerun)


__all__ = ["RaySummary", "connect", "run_batch_on_ray"]
