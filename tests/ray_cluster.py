"""A real local Ray cluster for the tests: ``ray start`` subprocesses, one per node.

Each node runs in a session of its own, with its own ``--temp-dir`` and its own sandcell home
(``$SANDCELL_HOME`` where its ``ray start`` ran), one CPU and ``sandcell_slots`` slots, on
loopback only. :func:`kill_node` takes a node down the way a crashed machine goes: its raylet and
every process of it at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Cluster:
    address: str
    root: Path
    """Holds every node's --temp-dir: a process whose command line names it is the cluster's."""
    homes: dict[str, Path]
    """Node name → its sandcell home."""
    temp_dirs: dict[str, Path]
    sessions: dict[str, int]
    """Node name → the session its processes run in."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _session_of(stat: bytes) -> int:
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    return int(stat.rsplit(b")", 1)[1].split()[3])


def _node_pids(sessions: set[int], marker: str) -> list[int]:
    """The processes of the cluster's nodes: each node's ``ray start`` ran in a session of its
    own, which every process it started keeps; ``marker`` (the temp dir) in a command line or
    environment is a backstop (Ray's agents overwrite both with their titles)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            session = _session_of((entry / "stat").read_bytes())
            seen = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if session in sessions or marker.encode() in seen:
            found.append(int(entry.name))
    return found


def kill_all(sessions: set[int], marker: str) -> None:
    for _ in range(50):
        pids = _node_pids(sessions, marker)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def kill_node(cluster: Cluster, name: str) -> None:
    """Take node ``name`` down at once: its raylet and every process it started."""
    kill_all({cluster.sessions[name]}, str(cluster.temp_dirs[name]))


def _ray_start(
    args: list[str],
    home: Path,
    temp_dir: Path,
    *,
    resources: Mapping[str, float],
    env: Mapping[str, str],
) -> tuple[int, str]:
    """Start a node in a session of its own; returns that session's id and what it said."""
    full_env = {
        **os.environ,
        **env,
        "SANDCELL_HOME": str(home),
        "RAY_USAGE_STATS_ENABLED": "0",
        # A killed node is noticed in about 3 s rather than the default 15.
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    cmd = [
        str(RAY),
        "start",
        *args,
        f"--temp-dir={temp_dir}",
        "--num-cpus=1",
        f"--resources={json.dumps(dict(resources))}",
        "--object-store-memory=100000000",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
    ]
    proc = subprocess.Popen(
        cmd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        said, _ = proc.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        said, _ = proc.communicate()
        pytest.fail(f"ray start took over {START_TIMEOUT_S} s: {said[-800:]}")
    if proc.returncode != 0:
        kill_all({proc.pid}, str(temp_dir))
        pytest.skip(f"Ray cannot start a node here: {said[-800:]}")
    return proc.pid, said


def restart_cluster(cluster: Cluster, *, slots: int = 2) -> None:
    """Start every node of ``cluster`` again after :func:`kill_node` took them all down: the
    head on its old port and each node with its old home and temp dir (a head restarted
    without GCS fault tolerance, and its nodes joining the new one)."""
    names = list(cluster.sessions)
    port = cluster.address.rpartition(":")[2]
    for i, name in enumerate(names):
        if i == 0:
            args = ["--head", f"--port={port}", "--include-dashboard=false"]
        else:
            args = [f"--address={cluster.address}"]
        cluster.sessions[name], _ = _ray_start(
            args,
            cluster.homes[name],
            cluster.temp_dirs[name],
            resources={"sandcell_slots": slots},
            env={},
        )


@contextlib.contextmanager
def local_cluster(
    names: Sequence[str],
    *,
    slots: int = 2,
    extra_resources: Mapping[str, Mapping[str, float]] | None = None,
    env: Mapping[str, str] | None = None,
    node_env: Mapping[str, Mapping[str, str]] | None = None,
    prefix: str = "scray-",
) -> Iterator[Cluster]:
    """A cluster whose first node in ``names`` is the head; each node offers ``slots``
    sandcell slots and its ``extra_resources``; ``env`` is set for every node, ``node_env``
    (node name → variables) for the nodes it names, over ``env``."""
    # Short paths: Ray's unix sockets live under --temp-dir, and socket paths are limited.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    homes = {name: root / f"home-{name}" for name in names}
    temps = {name: root / f"t{i}" for i, name in enumerate(names)}
    sessions: dict[str, int] = {}
    extra = extra_resources or {}
    try:
        port = free_port()
        address = f"127.0.0.1:{port}"
        for i, name in enumerate(names):
            resources = {"sandcell_slots": slots, **extra.get(name, {})}
            if i == 0:
                args = ["--head", f"--port={port}", "--include-dashboard=false"]
            else:
                args = [f"--address={address}"]
            sessions[name], said = _ray_start(
                args,
                homes[name],
                temps[name],
                resources=resources,
                env={**(env or {}), **(node_env or {}).get(name, {})},
            )
            if i == 0:
                assert "Ray runtime started" in said, f"the head did not start: {said[-800:]}"
        yield Cluster(address=address, root=root, homes=homes, temp_dirs=temps, sessions=sessions)
    finally:
        kill_all(set(sessions.values()), str(root))
        shutil.rmtree(root, ignore_errors=True)
