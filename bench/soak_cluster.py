"""The cluster soak: a mixed load through two replicas on a three-node Ray cluster, with a node
killed, a replica restarted and PostgreSQL restarted under it; then the books.

    .venv/bin/python bench/soak_cluster.py --runs 10000 --concurrency 8   # the full soak
    .venv/bin/python bench/soak_cluster.py --runs 150 --concurrency 4     # what tests/soak runs

Everything is real and on this machine: a PostgreSQL server (``tests/pg_server.py``), three
``ray start`` nodes (``tests/ray_cluster.py``: each its own ``SANDCELL_HOME``, one CPU, two
``sandcell_slots``, all on loopback, all with the same ``SANDCELL_SHARED_DIR`` and
``SANDCELL_DATABASE_URL``) and two ``sandcell serve --cluster`` replicas. Each request is one of
:data:`KINDS` (bench/soak.py's mix, the kinds that mean the same on a cluster), sent to the
replicas alternately from ``--concurrency`` client threads; a client whose replica refuses the
connection or answers 503 tries the other one (after ``Retry-After``, within a bounded time),
and one answered 429 (the tenant's ``max_concurrent``, set below the client count) tries again.

The faults, each when a given fraction of the requests is answered: the node ``c`` is killed
(every process of its ``ray start``; it is neither the head nor the replicas' own node), then
what its sandboxes left on this machine, which lives on, is swept as docs/cluster.md says
(``sweep_stale``); replica B is killed with SIGKILL and started again on its port; PostgreSQL is
stopped and started again.

The books. Every request carries a tag in its code (a first comment line naming its index), so
each record in the shared audit log names the request it answers. A request whose replica died
while it ran got no answer on its connection: its answer is the record found afterwards (the
other replica records such runs ``infra_error`` "replica lost"); when there is none, the dead
replica had not begun it, and the request is sent again. Then: every request has exactly one
final answer; every answer's outcome is one its kind may end in, or ``infra_error`` "node lost"
/ "replica lost"; every answered run has exactly one record, no run id is recorded twice and no
record answers no request; ``sandcell audit verify`` passes; the tenant's ``max_concurrent`` was
never exceeded: the records' own [started_at, finished_at] intervals (each inside the run's
quota hold) never overlap more than that many deep (the records of lost runs are left out: their
sandbox may still run after the hold went with its replica), and ``/v1/tenant``'s ``in_flight``,
sampled through the load, never went above it; and nothing is left on the nodes (no process in a
run cgroup of a live node's supervisors, no such cgroup, no new file in the private TMPDIR, no
mount, no input staged under a node's home). The replicas' resident memory is sampled after
warm-up, in the middle and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from tests.pg_server import PostgresServer  # noqa: E402
from tests.ray_cluster import Cluster as Nodes  # noqa: E402
from tests.ray_cluster import _node_pids, kill_node, local_cluster  # noqa: E402
from tests.service.server import ServiceProcess, add_tenant  # noqa: E402

from sandcell.audit import AuditLog  # noqa: E402
from sandcell.client.wire import run_body  # noqa: E402
from sandcell.spec import Outcome  # noqa: E402


def _single() -> ModuleType:
    """bench/soak.py (the one-machine soak: its mix and its leftover checks), by its path: a
    plain ``import soak`` would find tests/soak under pytest."""
    name = "sandcell_bench_soak"  # the name tests/soak/conftest.py loads it under
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "soak.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


single = _single()
if TYPE_CHECKING:
    from bench.soak import Kind, Snapshot

KINDS: tuple[Kind, ...] = tuple(
    k
    for k in single.KINDS
    if k.name in {"ok", "error", "timeout", "output_flood", "export", "denied"}
)
"""bench/soak.py's kinds that need nothing a cluster changes (no approval store to count, no
bomb whose limit a node's cgroup version words differently)."""

NODES = ("a", "b", "c")
VICTIM = "c"
"""Not the head (the cluster goes with it), not the replicas' own node (a driver on a host with
several nodes attaches to the head's)."""
SLOTS = 2
DEAD_AFTER_S = 5.0
"""A silent replica is dead after this (the default is 15 s: shorter, so the restarted
replica's runs are recorded lost soon after; long enough that a loaded machine's late beat
does not make a live replica look dead)."""
RETRY_BUDGET_S = 300.0
"""How long one request may go on being refused (503, 429, a refused connection)."""
RUN_TIMEOUT_S = 600.0
SETTLE_S = 120.0
_TAG = re.compile(r"\A# soak request (\d+)\n")
_LOST = ("node lost", "replica lost")


def tagged(index: int, code: str) -> str:
    return f"# soak request {index}\n{code}"


def plan(runs: int) -> list[Kind]:
    """``runs`` kinds in a fixed, evenly spread interleaving (smooth weighted round robin)."""
    total = sum(k.weight for k in KINDS)
    credit = [0] * len(KINDS)
    out: list[Kind] = []
    for _ in range(runs):
        for i, k in enumerate(KINDS):
            credit[i] += k.weight
        best = max(range(len(KINDS)), key=lambda i: credit[i])
        credit[best] -= total
        out.append(KINDS[best])
    return out


# --- the parts ------------------------------------------------------------------------------


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment meanwhile (the stores read it when opened)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Replicas:
    """The two ``sandcell serve --cluster`` processes."""

    procs: list[ServiceProcess]
    restarted: list[int] = field(default_factory=list)
    """Pids of replicas killed and started again (their memory starts afresh)."""

    @classmethod
    def start(cls, root: Path, address: str, env: Mapping[str, str]) -> Replicas:
        procs = []
        for name in ("A", "B"):
            home = root / f"replica-{name}"
            home.mkdir(parents=True)
            args = ("--cluster", address, "--start", "cold", "--no-socket")
            procs.append(ServiceProcess(home, args=args, env=env))
        with ThreadPoolExecutor(len(procs)) as pool:
            started = [pool.submit(p.start, 300.0) for p in procs]
        failed = [e for f in started if (e := f.exception()) is not None]
        if failed:
            for p in procs:
                if p.proc is not None:
                    p.stop(signal.SIGKILL)
            raise failed[0]
        return cls(procs)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.procs]

    def restart(self, i: int) -> None:
        """SIGKILL replica ``i``, then start it again on its port, with its home."""
        old = self.procs[i]
        assert old.proc is not None
        self.restarted.append(old.proc.pid)
        old.stop(signal.SIGKILL)
        new = ServiceProcess(old.home, args=(*old.args, "--port", str(old.port)), env=old.env)
        self.procs[i] = new  # stopped with the others even if its start fails
        new.start(300.0)

    def pids(self) -> list[int]:
        return [p.proc.pid for p in self.procs if p.proc is not None]

    def stop(self) -> list[int]:
        return [p.stop() for p in self.procs]


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's final answer (not its output: the driver's memory stays flat)."""

    index: int
    kind: str
    run_id: str
    outcome: str
    reason: str
    artifacts: tuple[str, ...]
    how: str
    """``result`` (the replica answered), ``record`` (found in the log after its replica died)."""


@dataclass
class Books:
    sent: int = 0
    answers: list[Answer] = field(default_factory=list)
    broken: list[int] = field(default_factory=list)
    """Requests whose connection broke while their replica had them (it died)."""
    resent: int = 0
    failures: list[str] = field(default_factory=list)
    retries: Counter[str] = field(default_factory=Counter)
    rss_kib: list[tuple[str, dict[int, int]]] = field(default_factory=list)
    in_flight_max: int = 0
    in_flight_samples: int = 0
    faults: list[str] = field(default_factory=list)
    wall_s: float = 0.0


class Refused(Exception):
    """A replica answered something other than a result, 429 or 503."""


class Load:
    """The clients: each request sent until it has an answer, or its connection breaks."""

    def __init__(self, replicas: Replicas, key: str, books: Books) -> None:
        self.replicas = replicas
        self.key = key
        self.books = books
        self.lock = threading.Lock()
        self._local = threading.local()
        self._clients: list[httpx2.Client] = []

    def _http(self) -> httpx2.Client:
        client: httpx2.Client | None = getattr(self._local, "client", None)
        if client is None or client.is_closed:
            client = httpx2.Client(
                headers={"Authorization": f"Bearer {self.key}"}, timeout=RUN_TIMEOUT_S
            )
            self._local.client = client
            with self.lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        """Close every thread's client (once no request is being sent)."""
        with self.lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def _retry(self, why: str, seconds: float) -> None:
        with self.lock:
            self.books.retries[why] += 1
        time.sleep(seconds)

    def send(self, index: int, kind: Kind) -> Answer | None:
        """The answer to request ``index``; None when its connection broke in flight."""
        body = run_body(
            kind.request,
            profile=kind.profile,
            backend=None,
            schema=None,
            model=None,
            invariants=(),
            result_file=None,
            approve=None,
            wait=True,
        )
        body["code"] = tagged(index, kind.request.code)
        deadline = time.monotonic() + RETRY_BUDGET_S
        tries = 0
        while True:
            if time.monotonic() > deadline:
                raise Refused(f"still refused after {RETRY_BUDGET_S} s")
            url = self.replicas.urls[(index + tries) % 2]
            tries += 1
            try:
                got = self._http().post(f"{url}/v1/runs", json=body)
            except (httpx2.ConnectError, httpx2.ConnectTimeout):
                self._retry("connection refused", 0.1)  # nothing reached it: the other one
                continue
            except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError):
                return None  # it may have begun the run: its record will say
            if got.status_code in (429, 503):
                wait = min(float(got.headers.get("Retry-After", "1")), 2.0)
                self._retry(str(got.status_code), wait if got.status_code == 503 else 0.1)
                continue
            if got.status_code != 200:
                raise Refused(f"{got.status_code}: {got.text[:300]}")
            r = got.json()["result"]
            return Answer(
                index,
                kind.name,
                str(r["run_id"]),
                str(r["outcome"]),
                str(r["reason"]),
                tuple(str(a["path"]) for a in r["artifacts"]),
                "result",
            )

    def one(self, index: int, kind: Kind) -> None:
        try:
            answer = self.send(index, kind)
        except Exception as exc:
            with self.lock:
                self.books.failures.append(f"request {index} ({kind.name}): {exc!r}"[:400])
            return
        with self.lock:
            if answer is None:
                self.books.broken.append(index)
            else:
                self.books.answers.append(answer)


# --- the faults and the samples, at fractions of the load ------------------------------------


@dataclass
class Marks:
    """What happens when a fraction of the requests is done."""

    at: list[tuple[float, str]]
    done: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def tick(self) -> None:
        with self.cond:
            self.done += 1
            self.cond.notify_all()

    def wait(self, count: int, stop: threading.Event) -> bool:
        with self.cond:
            while self.done < count and not stop.is_set():
                self.cond.wait(0.5)
        return not stop.is_set()


def sweep_dead_machine() -> list[str]:
    """What the killed node's sandboxes left on this machine, which lives on: removed as after
    any crashed supervisor (docs/cluster.md, "A node dies")."""
    from sandcell.backends.registry import sweep_stale

    return sweep_stale()


def rss_of(pids: Sequence[int]) -> dict[int, int]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = single.rss_kib(pid)
    return out


# --- what is left on the nodes -----------------------------------------------------------------


def supervisor_tags(nodes: Nodes, names: Sequence[str]) -> list[str]:
    """The owner tags of every process of the named nodes (one of them is the agent, which
    names its runs' directories and cgroups with its tag)."""
    sessions = {nodes.sessions[n] for n in names}
    pids = _node_pids(sessions, "\0no-marker\0")
    return [single.owner_tag(p) for p in pids]


_CLOSE_AGENTS = """
import sys, ray
ray.init(address=sys.argv[1], namespace="sandcell", logging_level="ERROR")
names = [n for n in ray.util.list_named_actors() if n.startswith("sandcell-node-")]
closed = 0
for name in names:
    try:
        ray.get(ray.get_actor(name).close.remote(), timeout=120)
        closed += 1
    except Exception as exc:  # the lost node's agent went with it
        print(f"{name}: {type(exc).__name__}", file=sys.stderr)
print(closed)
"""


def close_agents(nodes: Nodes) -> int:
    """Close every live node's agent (its backends, with the spare cgroup each keeps for the
    next cold run, ``spare_cgroup.py``): what is left after that is left by the runs. A Ray
    driver of its own, so that this process never joins the cluster."""
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_AGENTS, nodes.address],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"closing the agents failed: {done.stderr[-2000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def staged(nodes: Nodes) -> list[str]:
    return [
        str(p)
        for home in nodes.homes.values()
        if (home / "cluster-inputs").is_dir()
        for p in (home / "cluster-inputs").iterdir()
    ]


def settled_snapshot(tmp: Path, tags: Sequence[str], places: Sequence[Path]) -> Snapshot:
    """A snapshot once no sandbox of the supervisors ``tags`` runs (runs a lost replica left on
    a node end when told to stop, or at their wall time): at most SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        snap: Snapshot = single.snapshot(tmp, tags, places=places)
        if not snap.processes or time.monotonic() > deadline:
            return snap
        time.sleep(0.5)


# --- the books -------------------------------------------------------------------------------


def all_records(env: Mapping[str, str], home: Path) -> list[Mapping[str, object]]:
    with environment(env), AuditLog(home / "audit.sqlite3") as audit:
        return [e.record for e in single._all_entries(audit)]


def max_overlap(records: Sequence[Mapping[str, object]]) -> tuple[int, str]:
    """How many of ``records``' [started_at, finished_at] intervals overlap at most, and
    where first (the time and the runs, for the problem it is when too many)."""
    events: list[tuple[datetime, int, str]] = []
    for r in records:
        start = datetime.fromisoformat(str(r["started_at"]))
        end = datetime.fromisoformat(str(r["finished_at"]))
        events += [(start, 1, str(r["run_id"])), (end, -1, str(r["run_id"]))]
    deepest, where = 0, ""
    running: dict[str, str] = {}
    for at, step, run_id in sorted(events):  # at one instant an end (-1) before a start
        if step > 0:
            running[run_id] = at.isoformat()
        else:
            running.pop(run_id, None)
        if len(running) > deepest:
            deepest = len(running)
            where = f"at {at.isoformat()}: " + ", ".join(
                f"{k} from {v}" for k, v in running.items()
            )
    return deepest, where


def lost(outcome: str, reason: str) -> bool:
    return outcome == Outcome.INFRA_ERROR.value and reason.startswith(_LOST)


def check_books(
    books: Books,
    kinds: Sequence[Kind],
    records: Sequence[Mapping[str, object]],
    max_concurrent: int,
) -> dict[str, object]:
    problems = list(books.failures)
    by_index = Counter(a.index for a in books.answers)
    problems += [f"request {i} has {n} answers" for i, n in by_index.items() if n != 1]
    missing = [i for i in range(books.sent) if i not in by_index]
    problems += [f"request {i} has no answer" for i in missing[:10]]
    expected = {k.name: k for k in kinds}
    for a in books.answers:
        kind = expected[a.kind]
        if lost(a.outcome, a.reason):
            continue
        if Outcome(a.outcome) not in kind.outcomes:
            problems.append(f"{a.kind} run {a.run_id} ended {a.outcome}: {a.reason[:200]}")
        elif a.kind == "export" and a.artifacts != ("out.txt",):
            problems.append(f"export run {a.run_id} exported {a.artifacts}")
    answered = Counter(a.run_id for a in books.answers)
    problems += [f"run id {i} answers {n} requests" for i, n in answered.items() if n != 1]
    recorded = Counter(str(r["run_id"]) for r in records)
    problems += [f"run id {i} has {n} records" for i, n in recorded.items() if n != 1]
    problems += [f"run {i} has no record" for i in [i for i in answered if i not in recorded][:10]]
    extra = [i for i in recorded if i not in answered]
    problems += [f"record {i} answers no request" for i in extra[:10]]
    for r in records:
        found = _TAG.match(str(r.get("code", "")))
        run_id = str(r["run_id"])
        if found is None:
            problems.append(f"record {run_id} has no request tag")
        elif run_id in answered and int(found.group(1)) not in {
            a.index for a in books.answers if a.run_id == run_id
        }:
            problems.append(f"record {run_id} names request {found.group(1)}, not its own")
    outcome_of = {str(r["run_id"]): str(r["outcome"]) for r in records}
    problems += [
        f"run {a.run_id} answered {a.outcome}, recorded {outcome_of[a.run_id]}"
        for a in books.answers
        if a.run_id in outcome_of and outcome_of[a.run_id] != a.outcome
    ][:10]
    held = [r for r in records if not lost(str(r["outcome"]), str(r.get("reason", "")))]
    overlap, where = max_overlap(held)
    if overlap > max_concurrent:
        problems.append(f"{overlap} runs ran at once, max_concurrent is {max_concurrent}: {where}")
    if books.in_flight_max > max_concurrent:
        problems.append(f"/v1/tenant said in_flight {books.in_flight_max} > {max_concurrent}")
    outcomes = Counter(a.outcome for a in books.answers)
    lost_reasons = Counter(
        a.reason.split(":")[0] for a in books.answers if lost(a.outcome, a.reason)
    )
    return {
        "requests": books.sent,
        "answers": len(books.answers),
        "answered_by_record": sum(1 for a in books.answers if a.how == "record"),
        "resent": books.resent,
        "records": len(records),
        "outcomes": dict(sorted(outcomes.items())),
        "lost": dict(sorted(lost_reasons.items())),
        "kinds": dict(sorted(Counter(a.kind for a in books.answers).items())),
        "retries": dict(sorted(books.retries.items())),
        "max_concurrent": max_concurrent,
        "max_overlap_of_records": overlap,
        "in_flight_max_sampled": books.in_flight_max,
        "in_flight_samples": books.in_flight_samples,
        "wall_s": round(books.wall_s, 1),
        "runs_per_s": round(books.sent / books.wall_s, 2) if books.wall_s else 0.0,
        "problems": problems,
    }


# --- the soak --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    kill_node_at: float = 0.3
    restart_replica_at: float = 0.5
    restart_postgres_at: float = 0.7
    postgres_down_s: float = 3.0


def soak_cluster(
    root: Path,
    runs: int,
    concurrency: int,
    *,
    faults: Faults = Faults(),
    max_concurrent: int | None = None,
    progress: bool = False,
) -> dict[str, object]:
    """The whole soak under ``root`` (with ``TMPDIR`` already private to it): the figures, with
    ``problems`` and ``leftovers`` empty when the books balance."""
    tmp = Path(tempfile.gettempdir())
    quota = max_concurrent or max(1, concurrency * 3 // 4)
    shared = root / "shared"
    shared.mkdir(parents=True)
    t_setup = time.monotonic()
    # Right under /tmp: the server runs as another user, who cannot enter our private dirs.
    with PostgresServer(base_dir=Path("/tmp")) as pg:
        url = pg.create_database("soak")
        env = {
            "SANDCELL_DATABASE_URL": url,
            "SANDCELL_SHARED_DIR": str(shared),
            "TMPDIR": str(tmp),
        }
        replica_env = {**env, "SANDCELL_REPLICA_DEAD_AFTER_S": str(DEAD_AFTER_S)}
        with local_cluster(NODES, slots=SLOTS, env=env, prefix="sccsoak-") as nodes:
            replicas = Replicas.start(root, nodes.address, replica_env)
            try:
                with environment(env):
                    key = add_tenant(
                        replicas.procs[0].home,
                        "soak",
                        profiles=("unchecked", "strict"),
                        max_concurrent=quota,
                        runs_per_minute=1_000_000,
                        cpu_seconds_per_day=10_000_000,
                        max_stored_bytes=1 << 40,
                    )
                before = single.snapshot(tmp, [], places=list(nodes.homes.values()))
                setup_s = time.monotonic() - t_setup
                books = run_load(
                    pg,
                    nodes,
                    replicas,
                    key=key,
                    runs=runs,
                    concurrency=concurrency,
                    faults=faults,
                    progress=progress,
                )
                resolve_broken(books, replicas, key, replica_env)
                books.rss_kib.append(("end", rss_of(replicas.pids())))
                live = [n for n in NODES if n != VICTIM]
                tags = supervisor_tags(nodes, live)
                closed = close_agents(nodes)
                after = settled_snapshot(tmp, tags, list(nodes.homes.values()))
                left = single.leftovers(before, after)
                left["staged inputs"] = staged(nodes)
                records = all_records(env, replicas.procs[0].home)
                verify = subprocess.run(
                    [sys.executable, "-m", "sandcell", "audit", "verify"],
                    cwd=REPO,
                    env={**os.environ, **env, "SANDCELL_HOME": str(replicas.procs[0].home)},
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
            finally:
                codes = replicas.stop()
    figures = check_books(books, KINDS, records, quota)
    problems = figures["problems"]
    assert isinstance(problems, list)
    chain_ok = verify.returncode == 0 and verify.stdout.startswith("ok:")
    if not chain_ok:
        problems.append(f"sandcell audit verify: {verify.stdout.strip()} {verify.stderr[-500:]}")
    elif int(verify.stdout.split()[1]) != len(records):
        problems.append(f"verify counted {verify.stdout.split()[1]}, {len(records)} read")
    if codes != [-signal.SIGTERM] * 2:
        left["exit"] = [f"the replicas exited {codes} on SIGTERM"]
    return {
        **figures,
        "chain_ok": chain_ok,
        "setup_s": round(setup_s, 1),
        "faults": books.faults,
        "rss_kib": books.rss_kib,
        "restarted_pids": replicas.restarted,
        "agents_closed": closed,
        "leftovers": left,
    }


def run_load(
    pg: PostgresServer,
    nodes: Nodes,
    replicas: Replicas,
    *,
    key: str,
    runs: int,
    concurrency: int,
    faults: Faults,
    progress: bool,
) -> Books:
    books = Books(sent=runs)
    load = Load(replicas, key, books)
    kinds = plan(runs)
    events = sorted(
        [
            (0.1, "rss after warm-up"),
            (faults.kill_node_at, "kill node"),
            (faults.restart_replica_at, "restart replica"),
            (faults.restart_postgres_at, "restart postgres"),
            (0.55, "rss middle"),
            (0.8, "rss at 80%"),
        ]
    )
    marks = Marks(events)
    stop = threading.Event()
    t0 = time.monotonic()

    def note(what: str) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = f"{what} at {time.monotonic() - t0:.1f} s ({now}), {marks.done}/{runs} done"
        books.faults.append(line)
        if progress:
            print(f"  {line}", file=sys.stderr)

    def faulting() -> None:
        for fraction, what in events:
            if not marks.wait(int(fraction * runs), stop):
                return
            if what.startswith("rss"):
                books.rss_kib.append((what, rss_of(replicas.pids())))
                continue
            note(f"{what}: begins")
            if what == "kill node":
                kill_node(nodes, VICTIM)
                swept = sweep_dead_machine()
                note(f"kill node: node {VICTIM} killed, {len(swept)} leftovers of it swept")
            elif what == "restart replica":
                replicas.restart(1)
                note("restart replica: B answers again")
            else:
                pg.stop()
                time.sleep(faults.postgres_down_s)  # the outage's length, not a wait for an event
                pg.start()
                note("restart postgres: up again")

    def sampling() -> None:
        while not stop.is_set():
            for url in replicas.urls:
                with contextlib.suppress(httpx2.HTTPError, ValueError, KeyError):
                    got = httpx2.get(
                        f"{url}/v1/tenant",
                        headers={"Authorization": f"Bearer {key}"},
                        timeout=10,
                    )
                    if got.status_code == 200:
                        with load.lock:
                            books.in_flight_samples += 1
                            books.in_flight_max = max(books.in_flight_max, got.json()["in_flight"])
            stop.wait(0.25)

    def one(i: int) -> None:
        load.one(i, kinds[i])
        marks.tick()
        if progress and marks.done % max(1, runs // 10) == 0:
            print(f"  {marks.done}/{runs} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)

    side = [threading.Thread(target=faulting), threading.Thread(target=sampling)]
    for t in side:
        t.start()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(runs)))
    finally:
        load.close()
        books.wall_s = time.monotonic() - t0
        stop.set()
        for t in side:
            t.join()
    return books


def resolve_broken(books: Books, replicas: Replicas, key: str, env: Mapping[str, str]) -> None:
    """The answers of the requests whose replica died with them: once no replica has a run in
    flight (the dead one's were recorded lost by a live one), each request's record, found by
    its tag; a request with none was never begun, and is sent again."""
    import psycopg

    deadline = time.monotonic() + SETTLE_S + DEAD_AFTER_S
    with psycopg.connect(env["SANDCELL_DATABASE_URL"], autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM sandcell_cluster.runs_in_flight").fetchone()
            if row is not None and row[0] == 0:
                break
            if time.monotonic() > deadline:
                books.failures.append(f"{row} runs still in flight after the load")
                break
            time.sleep(0.5)
    if not books.broken:
        return
    by_tag: dict[int, list[Mapping[str, object]]] = {}
    for r in all_records(env, replicas.procs[0].home):
        found = _TAG.match(str(r.get("code", "")))
        if found is not None:
            by_tag.setdefault(int(found.group(1)), []).append(r)
    load = Load(replicas, key, books)
    kinds = plan(books.sent)
    for index in sorted(books.broken):
        found_records = by_tag.get(index, [])
        if not found_records:
            books.resent += 1
            load.one(index, kinds[index])
            continue
        for r in found_records:  # more than one is a problem the books will show
            books.answers.append(
                Answer(
                    index,
                    kinds[index].name,
                    str(r["run_id"]),
                    str(r["outcome"]),
                    str(r.get("reason", "")),
                    artifact_paths(r),
                    "record",
                )
            )
    load.close()


def artifact_paths(record: Mapping[str, object]) -> tuple[str, ...]:
    found = record.get("artifacts")
    return tuple(str(a["path"]) for a in found) if isinstance(found, list) else ()


def _print(figures: Mapping[str, object], concurrency: int) -> None:
    rss = figures["rss_kib"]
    assert isinstance(rss, list)
    print(
        f"cluster soak: {figures['requests']} requests, {figures['answers']} answers "
        f"({figures['answered_by_record']} from the record after their replica died, "
        f"{figures['resent']} sent again), {figures['records']} records, "
        f"chain ok: {figures['chain_ok']}; {figures['wall_s']} s of load "
        f"({figures['runs_per_s']} runs/s at concurrency {concurrency}), "
        f"setup {figures['setup_s']} s"
    )
    print(f"  outcomes: {figures['outcomes']}")
    print(f"  lost: {figures['lost']}")
    print(f"  retries: {figures['retries']}")
    print(
        f"  max_concurrent {figures['max_concurrent']}: records overlap at most "
        f"{figures['max_overlap_of_records']} deep; /v1/tenant in_flight at most "
        f"{figures['in_flight_max_sampled']} in {figures['in_flight_samples']} samples"
    )
    for when, by_pid in rss:
        shown = ", ".join(f"pid {p}: {k / 1024:.1f} MiB" for p, k in by_pid.items())
        print(f"  RSS {when}: {shown}")
    print(f"  replicas restarted (old pids): {figures['restarted_pids']}")
    faults = figures["faults"]
    assert isinstance(faults, list)
    for line in faults:
        print(f"  fault: {line}")
    problems = figures["problems"]
    assert isinstance(problems, list)
    for p in problems[:20]:
        print(f"  PROBLEM: {p}")
    left = figures["leftovers"]
    assert isinstance(left, dict)
    for what, items in left.items():
        for item in items[:10]:
            print(f"  LEFT ({what}): {item}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--max-concurrent", type=int, default=None, help="the tenant's (default: 3/4 of clients)"
    )
    parser.add_argument("--kill-node-at", type=float, default=Faults.kill_node_at)
    parser.add_argument("--restart-replica-at", type=float, default=Faults.restart_replica_at)
    parser.add_argument("--restart-postgres-at", type=float, default=Faults.restart_postgres_at)
    parser.add_argument("--postgres-down-s", type=float, default=Faults.postgres_down_s)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    faults = Faults(
        args.kill_node_at, args.restart_replica_at, args.restart_postgres_at, args.postgres_down_s
    )
    scratch = Path(tempfile.mkdtemp(prefix="sc-csoak-", dir="/tmp"))
    try:
        tmp = scratch / "tmp"
        tmp.mkdir()
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = None
        figures = soak_cluster(
            scratch / "root",
            args.runs,
            args.concurrency,
            faults=faults,
            max_concurrent=args.max_concurrent,
            progress=not args.json,
        )
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    if args.json:
        print(json.dumps(figures, sort_keys=True, default=str))
    else:
        _print(figures, args.concurrency)
    left = figures["leftovers"]
    assert isinstance(left, dict)
    ok = not figures["problems"] and not any(left.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
