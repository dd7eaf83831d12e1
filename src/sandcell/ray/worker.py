"""The sandcell worker of one node: a Ray actor holding that node's Executor.

The actor runs on the node it is pinned to, in a worker process the node's raylet started, so
its home (records, artifact store, warm pool) is the node's own: ``$SANDCELL_HOME`` as set where
``ray start`` ran on that node, else the data directory of the user Ray runs as. Each node thus
keeps its own hash-chained run record, which ``sandcell --home DIR audit verify`` checks there.

A task runs exactly as in a local batch (:func:`sandcell.batch.runner.run_task`); the exported
files travel back with the result line as bytes through Ray's object store.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sandcell.batch.runner import run_task
from sandcell.batch.tasks import Task
from sandcell.home import data_dir

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig
    from sandcell.policy.profiles import Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """Where a worker runs: the driver's index names nodes by these."""

    node_id: str
    hostname: str
    home: str
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutput:
    """One task's result line (as a local batch writes it) and its artifacts' bytes."""

    line: dict[str, object]
    artifacts: dict[str, bytes] = field(default_factory=dict)
    """SHA-256 → content of each artifact the line names."""


class NodeWorker:
    """The body of the per-node actor (made a Ray actor by the driver)."""

    def __init__(self, *, profile: Profile, backend: str | None, warm: WarmConfig | None) -> None:
        import ray

        from sandcell.executor import Executor

        home = data_dir()
        self.info = NodeInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            home=str(home),
            pid=os.getpid(),
        )
        self.executor = Executor(home=home, profile=profile, backend=backend, warm=warm)

    def describe(self) -> NodeInfo:
        return self.info

    def run(self, task: Task) -> TaskOutput:
        line = run_task(self.executor, task)
        blobs: dict[str, bytes] = {}
        artifacts = line.get("artifacts")
        for entry in artifacts if isinstance(artifacts, list) else ():
            sha = str(entry["sha256"])
            blobs[sha] = self.executor.store.path_for(sha).read_bytes()
        return TaskOutput(line=line, artifacts=blobs)

    def cancel_all(self, reason: str) -> int:
        return self.executor.cancel_all(reason)

    def close(self) -> None:
        self.executor.close()


__all__ = ["NodeInfo", "NodeWorker", "TaskOutput"]
