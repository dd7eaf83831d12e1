"""What the replica tests share: two real ``sandcell serve`` processes on loopback ports sharing
one PostgreSQL database (``$SANDCELL_DATABASE_URL``) and one shared directory, and the polling
helpers their tests wait with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx2
import pytest
from tests.pg_server import PostgresServer
from tests.service.server import REPO, ServiceProcess, add_tenant

__all__ = [
    "DEADLINE_S",
    "LONG_RUN",
    "Cluster",
    "cluster_in",
    "cluster_of",
    "eventually",
    "finished",
]

T = TypeVar("T")

DEADLINE_S = 90.0
"""How long to wait for an event (generous: a loaded 2-core machine is slow, not wrong)."""
LONG_RUN = {"code": "import time\ntime.sleep(60)", "limits": {"wall_time_s": 60}, "wait": False}
"""A run that stays in flight until it is cancelled or its replica dies."""


def eventually(what: str, probe: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """Poll ``probe`` until it answers something other than None."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        got = probe()
        if got is not None:
            return got
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what} after {deadline_s} s")


@dataclass(frozen=True)
class Cluster:
    """What the replicas share: the database, the shared directory, the environment."""

    url: str
    shared: Path
    env: Mapping[str, str]

    def replicas(self, *homes: Path, **more: str) -> list[ServiceProcess]:
        """One replica per home, started at once (as a deployment does: they migrate the
        database under its lock); all stopped again if one fails to start."""
        procs = []
        for home in homes:
            home.mkdir(parents=True, exist_ok=True)
            procs.append(ServiceProcess(home, args=("--start", "cold"), env={**self.env, **more}))
        with ThreadPoolExecutor(len(procs)) as pool:
            started = [pool.submit(p.start) for p in procs]
        failed = [e for f in started if (e := f.exception()) is not None]
        if failed:
            for p in procs:
                if p.proc is not None:
                    p.stop(signal.SIGKILL)
            raise failed[0]
        return procs

    def tenant(
        self,
        home: Path,
        name: str,
        *,
        max_concurrent: int = 4,
        runs_per_minute: int = 600,
        profiles: Sequence[str] = ("strict",),
    ) -> str:
        """A tenant added once, in the shared store (``sandcell tenants add`` with the env)."""
        with pytest.MonkeyPatch.context() as mp:
            for k, v in self.env.items():
                mp.setenv(k, v)
            return add_tenant(
                home,
                name,
                profiles=profiles,
                max_concurrent=max_concurrent,
                runs_per_minute=runs_per_minute,
            )

    def cli(self, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env, "SANDCELL_HOME": str(home)}
        return subprocess.run(
            [sys.executable, "-m", "sandcell", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def verified_count(self, home: Path) -> int:
        """``sandcell audit verify``: ok, and the number of records in the chain."""
        done = self.cli(home, "audit", "verify")
        assert done.returncode == 0, done.stdout + done.stderr
        first = done.stdout.split()
        assert first[0] == "ok:", done.stdout
        return int(first[1])


def cluster_of(url: str, shared: Path, **more: str) -> Cluster:
    return Cluster(
        url=url,
        shared=shared,
        env={"SANDCELL_DATABASE_URL": url, "SANDCELL_SHARED_DIR": str(shared), **more},
    )


@contextmanager
def cluster_in(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A cluster on a database of its own in ``postgres_server``, dropped afterwards (a test
    module's ``cluster`` fixture)."""
    name = f"replicas_{uuid.uuid4().hex[:12]}"
    url = postgres_server.create_database(name)
    yield cluster_of(url, tmp_path_factory.mktemp("replicas-shared"))
    if not postgres_server.is_running():
        postgres_server.start()
    postgres_server.drop_database(name)


def finished(client: httpx2.Client, run_id: str) -> Callable[[], dict[str, object] | None]:
    def probe() -> dict[str, object] | None:
        got = client.get(f"/v1/runs/{run_id}")
        assert got.status_code == 200, got.text
        body: dict[str, object] = got.json()
        return body if body["status"] == "finished" else None

    return probe
