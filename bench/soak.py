"""Load and soak: a mixed load through the executor and the service, then check the books.

    .venv/bin/python bench/soak.py --runs 10000 --concurrency 8            # the full soak
    .venv/bin/python bench/soak.py --runs 300 --concurrency 4 --via both   # what CI runs
    .venv/bin/python bench/soak.py --runs 1000 --concurrency 4 --backend gvisor     # upper rungs
    .venv/bin/python bench/soak.py --runs 300 --concurrency 2 --backend microvm

Every request is one of :data:`KINDS` (ok, error, timeout, memory bomb, fork bomb, output flood,
export, denied, approval-waiting), in a fixed interleaving. Afterwards the books must balance:
every request has exactly one result and exactly one run record (counted by run id), every
result has the outcome its kind must end in, the audit chain verifies, the approval store holds
exactly one pending ticket per approval-waiting run, and nothing is left behind: no process,
run cgroup, run directory, mount, socket or temp file of the processes that ran the load. The
resident memory of the long-running process (the service, or this process for the executor) is
sampled at the start, the middle and the end of the load and printed.

The temp-file check is exact because the load runs with ``TMPDIR`` pointing at a directory of
its own (sandcell's run directories and socket directories live under ``tempfile.gettempdir()``),
so other users of the host's ``/tmp`` cannot blur it. The tests in ``tests/soak`` import this
module and run it with a small count.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.audit import AuditEntry, AuditLog
from sandcell.spec import Limits, Outcome, RunRequest, RunResult

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Kind:
    """One sort of request in the mix and the outcomes it may end in."""

    name: str
    request: RunRequest
    profile: str
    outcomes: frozenset[Outcome]
    weight: int


_FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

_SIGNAL_PROOF = """
import signal, time
for s in range(1, 65):
    try:
        signal.signal(s, signal.SIG_IGN)
    except (OSError, ValueError, RuntimeError):
        pass
while True:
    time.sleep(0.01)
"""

KINDS: tuple[Kind, ...] = (
    Kind(
        "ok", RunRequest(code="print(sum(range(1000)))"), "unchecked", frozenset({Outcome.OK}), 30
    ),
    Kind(
        "error",
        RunRequest(code="raise ValueError('soak')"),
        "unchecked",
        frozenset({Outcome.ERROR}),
        10,
    ),
    Kind(
        "timeout",
        RunRequest(code="while True: pass", limits=Limits(wall_time_s=0.5, cpu_time_s=5)),
        "unchecked",
        frozenset({Outcome.TIMEOUT}),
        4,
    ),
    Kind(
        "memory_bomb",
        RunRequest(
            code="x = []\nwhile True: x.append(bytearray(8 << 20))",
            limits=Limits(memory_bytes=64 * MiB),
        ),
        "unchecked",
        frozenset({Outcome.MEMORY_LIMIT}),
        8,
    ),
    Kind(
        "fork_bomb",
        RunRequest(code=_FORK_BOMB, limits=Limits(wall_time_s=0.5, max_pids=16)),
        "unchecked",
        # The pids limit holds the bomb at 16 processes; the wall time ends it.
        frozenset({Outcome.TIMEOUT, Outcome.MEMORY_LIMIT}),
        4,
    ),
    Kind(
        "output_flood",
        RunRequest(
            code="import sys\nwhile True: sys.stdout.write('x' * 65536)",
            limits=Limits(stdout_bytes=256 * 1024),
        ),
        "unchecked",
        frozenset({Outcome.OUTPUT_LIMIT}),
        8,
    ),
    Kind(
        "export",
        RunRequest(code="open('out.txt', 'w').write('soak')", exports=("out.txt",)),
        "unchecked",
        frozenset({Outcome.OK}),
        12,
    ),
    Kind("denied", RunRequest(code="import ctypes"), "strict", frozenset({Outcome.DENIED}), 12),
    Kind(
        "approval",
        RunRequest(code="import subprocess"),
        "strict",
        frozenset({Outcome.AWAITING_APPROVAL}),
        12,
    ),
)

SIGNAL_PROOF = RunRequest(code=_SIGNAL_PROOF, limits=Limits(wall_time_s=1.0))
"""A program that ignores every signal it can (SIGKILL cannot be ignored)."""


def plan(runs: int) -> list[Kind]:
    """``runs`` kinds in a fixed, evenly spread interleaving (smooth weighted round robin)."""
    total = sum(k.weight for k in KINDS)
    credit = dict.fromkeys(range(len(KINDS)), 0)
    out: list[Kind] = []
    for _ in range(runs):
        for i, k in enumerate(KINDS):
            credit[i] += k.weight
        best = max(credit, key=lambda i: credit[i])
        credit[best] -= total
        out.append(KINDS[best])
    return out


# --- what is left behind ------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[19]


def owner_tag(pid: int) -> str:
    """The tag sandcell names a supervisor's run directories and cgroups with (pid-starttime)."""
    found = _stat(pid)
    return f"{pid}-{found[1] if found else '?'}"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cgroup_dirs(tags: Sequence[str]) -> list[str]:
    """Run cgroups of the supervisors ``tags`` (v1: one per controller; v2: one)."""
    from sandcell.backends.host.cgroups import CgroupHost, detect

    host = detect()
    bases = list(host.bases.values()) if isinstance(host, CgroupHost) else []
    if isinstance(host, CgroupHost) and host.freezer is not None:
        bases.append(host.freezer)
    found = []
    for base in bases:
        try:
            names = os.listdir(base)
        except OSError:
            continue  # not this cgroup version, or gone meanwhile
        found += [str(base / n) for n in names if n.startswith(tuple(tags))]
    return sorted(found)


def _mounts(places: Sequence[str]) -> set[str]:
    """Mounts of this mount namespace at or below ``places`` (other users of the host mount
    and unmount their own things meanwhile)."""
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    return {p for p in points if p.startswith(tuple(places))}


def _sockets(pid: int) -> int:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    count = 0
    for name in names:
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
    return count


_SHARED_ETC = re.compile(r"sandcell-\d+/etc/")
"""The synthetic /etc every sandbox of this uid shares, made once and kept on purpose
(``workspace.prepare_root``): not a run's leftover."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a set of supervising processes has on the host."""

    processes: tuple[str, ...]
    cgroups: tuple[str, ...]
    mounts: frozenset[str]
    temp: tuple[str, ...]


def snapshot(
    tmpdir: Path, owners: Sequence[str], roots: Sequence[int] = (), places: Sequence[Path] = ()
) -> Snapshot:
    """Processes below ``roots``, run cgroups of ``owners``, mounts under ``tmpdir`` and
    ``places``, and what is in ``tmpdir`` (the load's private TMPDIR) apart from empty
    directories and the shared synthetic /etc."""
    procs = []
    for root in roots:
        for pid in descendants(root):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            procs.append(f"{pid} {cmd.strip()[:120]}")
    if owners:
        # A sandbox whose supervisor is gone is nobody's descendant: find it by its run cgroup.
        for entry in os.listdir("/proc"):
            try:
                groups = Path(f"/proc/{entry}/cgroup").read_text() if entry.isdigit() else ""
            except OSError:
                continue
            if any(f"/{t}." in groups for t in owners):
                procs.append(f"{entry} in a run cgroup of {owners}")
    temp = sorted(
        str(p.relative_to(tmpdir))
        for p in _files_below(tmpdir)
        if not _SHARED_ETC.match(str(p.relative_to(tmpdir)))
    )
    mounts = frozenset(_mounts([str(tmpdir), *map(str, places)]))
    return Snapshot(tuple(procs), tuple(_cgroup_dirs(owners)), mounts, tuple(temp))


def _files_below(root: Path) -> list[Path]:
    """Every entry below ``root`` that is not a directory (links included). Sandboxes come and
    go while it looks (a run directory removed between being listed and being entered): what
    vanished meanwhile is simply not there, where Path.rglob would raise."""
    found: list[Path] = []
    for top, dirs, files in os.walk(root, onerror=lambda _: None):
        here = Path(top)
        found += [here / name for name in files]
        found += [here / name for name in dirs if (here / name).is_symlink()]
    return found


def leftovers(before: Snapshot, after: Snapshot) -> dict[str, list[str]]:
    """What ``after`` has that ``before`` had not: each must be empty."""
    return {
        "processes": [p for p in after.processes if p not in before.processes],
        "cgroups": [c for c in after.cgroups if c not in before.cgroups],
        "mounts": sorted(after.mounts - before.mounts),
        "temp": [t for t in after.temp if t not in before.temp],
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- the load ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    """What the books keep of one result: not its output, so that the driver's own memory
    does not grow with the load it measures."""

    run_id: str
    outcome: Outcome
    reason: str | None
    artifacts: tuple[str, ...]

    @classmethod
    def of(cls, result: RunResult) -> Seen:
        paths = tuple(a.path for a in result.artifacts)
        return cls(result.run_id, result.outcome, result.reason, paths)


@dataclass
class Books:
    """What a load produced, for :func:`check_books`."""

    sent: int = 0
    results: list[tuple[Kind, Seen]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    wall_s: float = 0.0


RunOne = Callable[[Kind], RunResult]


def drive(
    run_one: RunOne,
    runs: int,
    concurrency: int,
    sample_rss: Callable[[], int],
    *,
    progress: bool = False,
) -> Books:
    """Send ``runs`` requests of the mix through ``run_one`` from ``concurrency`` threads
    (``progress``: a line on stderr at every tenth)."""
    books = Books()
    kinds = plan(runs)
    lock = threading.Lock()
    marks = {runs // 2, runs - 1}
    t0 = time.monotonic()

    def one(i: int) -> None:
        kind = kinds[i]
        try:
            result = run_one(kind)
        except Exception as exc:
            with lock:
                books.failures.append(f"request {i} ({kind.name}): {type(exc).__name__}: {exc}")
            return
        with lock:
            books.results.append((kind, Seen.of(result)))
            if i in marks:
                books.rss_kib.append(sample_rss())
            done = len(books.results) + len(books.failures)
            if progress and done % max(1, runs // 10) == 0:
                print(f"  {done}/{runs} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)

    books.rss_kib.append(sample_rss())
    with ThreadPoolExecutor(concurrency) as pool:
        books.sent = runs
        list(pool.map(one, range(runs)))
    books.wall_s = time.monotonic() - t0
    return books


def check_books(books: Books, audit_path: Path, approvals_path: Path | None) -> dict[str, object]:
    """The balance of a finished load: a dict of figures and a list of ``problems`` (empty when
    every request has exactly one result and one record and the chain verifies)."""
    problems = list(books.failures)
    if len(books.results) + len(books.failures) != books.sent:
        problems.append(f"{books.sent} requests sent, {len(books.results)} results")
    ids = Counter(r.run_id for _, r in books.results)
    problems += [f"run id {i} returned {n} times" for i, n in ids.items() if n != 1]
    for kind, result in books.results:
        if result.outcome not in kind.outcomes:
            problems.append(
                f"{kind.name} run {result.run_id} ended {result.outcome.value}: {result.reason}"
            )
        if kind.name == "export" and result.artifacts != ("out.txt",):
            problems.append(f"export run {result.run_id} exported {result.artifacts}")
    with AuditLog(audit_path) as audit:
        report = audit.verify()
        recorded = Counter(e.run_id for e in _all_entries(audit))
    if not report.ok:
        problems.append(f"audit chain does not verify: {report}")
    problems += [f"run id {i} has {n} records" for i, n in recorded.items() if n != 1]
    missing = [i for i in ids if i not in recorded]
    problems += [f"run {i} has no record" for i in missing[:10]]
    extra = [i for i in recorded if i not in ids]
    problems += [f"record {i} answers no request" for i in extra[:10]]
    waiting = sum(1 for k, _ in books.results if k.name == "approval")
    if approvals_path is not None:
        pending = _pending_tickets(approvals_path)
        if pending != waiting:
            problems.append(f"{waiting} runs wait for approval, {pending} pending tickets")
    outcomes = Counter(r.outcome.value for _, r in books.results)
    return {
        "requests": books.sent,
        "results": len(books.results),
        "records": sum(recorded.values()),
        "chain_ok": report.ok,
        "outcomes": dict(sorted(outcomes.items())),
        "kinds": dict(sorted(Counter(k.name for k, _ in books.results).items())),
        "rss_kib": books.rss_kib,
        "wall_s": round(books.wall_s, 1),
        "runs_per_s": round(books.sent / books.wall_s, 1) if books.wall_s else 0.0,
        "problems": problems,
    }


def _all_entries(audit: AuditLog) -> Iterator[AuditEntry]:
    offset = 0
    while page := audit.list(limit=1000, offset=offset):
        yield from page
        offset += len(page)


def _pending_tickets(path: Path) -> int:
    from sandcell.policy.approvals import ApprovalStore

    with ApprovalStore(path) as store:
        return len(store.list(status="pending", limit=1 << 30))


# --- the two ways in -----------------------------------------------------------------------


def soak_executor(
    home: Path,
    runs: int,
    concurrency: int,
    *,
    progress: bool = False,
    backend: str = "namespaces",
) -> dict[str, object]:
    """The load through one in-process :class:`Executor` (warm pool) on ``backend``, then the
    books."""
    from sandcell.backends.warm import WarmConfig
    from sandcell.executor import Executor

    me = os.getpid()
    tmpdir = Path(tempfile.gettempdir())
    before = snapshot(tmpdir, [owner_tag(me)], [me], [home])
    sockets_before = _sockets(me)
    warm = WarmConfig(mode="pool", preload=(), pool_size=2)
    with Executor(home=home, backend=backend, warm=warm) as ex:
        books = drive(
            lambda k: ex.run(k.request, profile=k.profile),
            runs,
            concurrency,
            lambda: rss_kib(me),
            progress=progress,
        )
    figures = check_books(books, home / "audit.sqlite3", home / "approvals.sqlite3")
    left = leftovers(before, snapshot(tmpdir, [owner_tag(me)], [me], [home]))
    sockets = _sockets(me) - sockets_before
    if sockets > 0:
        left["sockets"] = [f"{sockets} more sockets open in the driver"]
    return {"via": "executor", "backend": backend, **figures, "leftovers": left}


_SERVING = re.compile(r"serving on http://127\.0\.0\.1:(\d+)")


@dataclass
class Serve:
    """A ``sandcell serve`` process on a free loopback port."""

    home: Path
    proc: subprocess.Popen[str]
    url: str

    @classmethod
    def start(cls, home: Path, *args: str) -> Serve:
        env = {**os.environ, "SANDCELL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        env.pop("SANDCELL_BACKEND", None)
        with (home / "serve.log").open("a") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sandcell", "serve", "--port", "0", *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert proc.stdout is not None
        found = _SERVING.search(proc.stdout.readline())
        if found is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sandcell serve did not start: {(home / 'serve.log').read_text()}")
        return cls(home, proc, f"http://127.0.0.1:{found.group(1)}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(120)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code


def soak_service(
    home: Path,
    runs: int,
    concurrency: int,
    *,
    progress: bool = False,
    backend: str = "namespaces",
) -> dict[str, object]:
    """The load through a real ``sandcell serve`` on ``backend`` and the client SDK, then the
    books."""
    from sandcell.client import Client
    from sandcell.service.tenants import TenantStore

    home.mkdir(parents=True, exist_ok=True)
    with TenantStore.in_home(home) as store:
        _, key = store.add(
            "soak",
            profiles=("unchecked", "strict"),
            max_concurrent=concurrency,
            runs_per_minute=1_000_000,
            cpu_seconds_per_day=10_000_000,
            max_stored_bytes=1 << 40,
        )
    tmpdir = Path(tempfile.gettempdir())
    me = os.getpid()
    mounts_before = snapshot(tmpdir, [], [me], [home])
    serve = Serve.start(
        home, "--start", "pool", "--workers", str(concurrency), "--backend", backend
    )
    tag = owner_tag(serve.proc.pid)
    try:
        with Client(serve.url, key, timeout=120) as client:
            books = drive(
                lambda k: client.run(k.request, profile=k.profile),
                runs,
                concurrency,
                lambda: rss_kib(serve.proc.pid),
                progress=progress,
            )
    finally:
        code = serve.stop()
    figures = check_books(books, home / "audit.sqlite3", home / "approvals.sqlite3")
    left = leftovers(mounts_before, snapshot(tmpdir, [tag], [me], [home]))
    left["sockets"] = [str(p) for p in home.rglob("*.sock")]
    if code != -signal.SIGTERM:
        left["exit"] = [f"sandcell serve exited {code} on SIGTERM"]
    return {"via": "service", "backend": backend, **figures, "leftovers": left}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--via", choices=("executor", "service", "both"), default="both")
    parser.add_argument(
        "--backend", choices=("namespaces", "gvisor", "microvm"), default="namespaces"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory(prefix="sandcell-soak-") as scratch:
        # The load's own temp directory: what sandcell leaves in it is exactly a leftover.
        tmp = Path(scratch) / "tmp"
        tmp.mkdir()
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = None
        for via in ("executor", "service") if args.via == "both" else (args.via,):
            home = Path(scratch) / via
            soak = soak_executor if via == "executor" else soak_service
            figures = soak(
                home, args.runs, args.concurrency, progress=not args.json, backend=args.backend
            )
            left = figures["leftovers"]
            assert isinstance(left, dict)
            problems = figures["problems"]
            assert isinstance(problems, list)
            found = sum(len(v) for v in left.values())
            ok = ok and not problems and not found
            if args.json:
                print(json.dumps(figures, sort_keys=True))
                continue
            rss = ", ".join(f"{k / 1024:.1f}" for k in figures["rss_kib"])  # type: ignore[attr-defined]
            print(
                f"{via} on {args.backend}: {figures['requests']} requests, "
                f"{figures['results']} results, {figures['records']} records, "
                f"chain ok: {figures['chain_ok']}, "
                f"{figures['wall_s']} s ({figures['runs_per_s']} runs/s at concurrency "
                f"{args.concurrency}); RSS start/middle/end MiB: {rss}; leftovers: {found}"
            )
            print(f"  outcomes: {figures['outcomes']}")
            for p in problems[:20]:
                print(f"  PROBLEM: {p}")
            for what, items in left.items():
                for item in items[:10]:
                    print(f"  LEFT ({what}): {item}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
