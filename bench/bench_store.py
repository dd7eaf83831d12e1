"""Benchmark: records appended to the audit log, on SQLite and on PostgreSQL, in one run.

Usage::

    .venv/bin/python bench/bench_store.py [--records 2000] [--writers 4] [--json]
    .venv/bin/python bench/bench_store.py --threads 1,2,4,8 [--against TREE] [--rounds 3]

The audit log's append is one transaction that takes the log's write lock (SQLite's
``BEGIN IMMEDIATE``, PostgreSQL's advisory lock of the store), reads the head, inserts the entry
and moves the head: the chain stays one chain, and its writers take turns. This measures what
that costs: ``--records`` appends of a run-sized record (about 2 KiB of JSON) from one process,
then from ``--writers`` processes at once, on a SQLite file under a temporary home and on a
fresh database of a PostgreSQL started here (Debian's, as an ordinary user, over loopback TCP:
``tests/pg_server.py``, with fsync off, so the figure is the database's and Python's work, not
the disk's). Printed: appends per second of each, and PostgreSQL's over SQLite's (the baseline,
measured in the same run). The chain is verified after each.

``--threads``: the appends of threads of one process sharing one log (the service, ``sandcell
batch -c N``), which the log writes in group commits: appends per second with each number of
threads, on both databases. Each figure is taken in a fresh child process. ``--against TREE``
(a checkout of sandcell, e.g. ``git worktree add /tmp/base <commit>``) measures that tree's
sandcell too, alternating with this one's in every round (the host's load drifts; alternating
spreads it over both), and prints the median of ``--rounds`` of each and this tree's over it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.pg_server import PostgresServer  # noqa: E402

from sandcell.audit import AuditLog  # noqa: E402

_RECORD = {"code": "print('x')\n" * 40, "stdout": "y" * 1200, "outcome": "ok", "exit_code": 0}


def _append(where: tuple[str, str | None], prefix: str, count: int, ready: Any, go: Any) -> None:
    path, url = where
    if url is None:
        os.environ.pop("SANDCELL_DATABASE_URL", None)
    else:
        os.environ["SANDCELL_DATABASE_URL"] = url
    with AuditLog(Path(path)) as log:
        ready.release()
        go.wait()  # every writer opened and connected: only the appends are timed
        for i in range(count):
            log.append({**_RECORD, "run_id": f"{prefix}-{i}"})


def _rate(path: Path, url: str | None, records: int, writers: int) -> float:
    """Appends per second of ``writers`` processes appending ``records`` in all."""
    each = records // writers
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(
            target=_append,
            args=((str(path), url), f"w{w}-{uuid.uuid4().hex[:6]}", each, ready, go),
        )
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    began = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a writer failed with {p.exitcode}")
    rate = each * writers / (time.perf_counter() - began)
    if url is not None:
        os.environ["SANDCELL_DATABASE_URL"] = url
    with AuditLog(path) as log:
        report = log.verify()
    os.environ.pop("SANDCELL_DATABASE_URL", None)
    if not report.ok:
        raise SystemExit(f"the chain does not verify: {report.problems[:3]}")
    return rate


def _threads_child(path: Path, url: str | None, records: int, threads: int) -> tuple[float, float]:
    """In a child process: appends per second of ``threads`` threads sharing one log, and the
    CPU time of this process per append, in microseconds (the database server's not counted;
    less disturbed by other load on the host than the rate)."""
    if url is None:
        os.environ.pop("SANDCELL_DATABASE_URL", None)
    else:
        os.environ["SANDCELL_DATABASE_URL"] = url
    each = records // threads
    prefix = uuid.uuid4().hex[:6]
    go = threading.Barrier(threads + 1)
    failed: list[BaseException] = []
    with AuditLog(path) as log:
        log.append({**_RECORD, "run_id": f"{prefix}-warm"})  # connected, statements prepared

        def work(t: int) -> None:
            go.wait()
            try:
                for i in range(each):
                    log.append({**_RECORD, "run_id": f"{prefix}-{t}-{i}"})
            except BaseException as e:  # reported below, after every thread ended
                failed.append(e)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        go.wait()
        began, cpu = time.perf_counter(), time.process_time()
        for w in workers:
            w.join()
        rate = each * threads / (time.perf_counter() - began)
        cpu_us = (time.process_time() - cpu) * 1e6 / (each * threads)
        if failed:
            raise SystemExit(f"an append failed: {failed[0]!r}")
        report = log.verify()
    if not report.ok:
        raise SystemExit(f"the chain does not verify: {report.problems[:3]}")
    return rate, cpu_us


def _threads_rate(
    tree: Path, path: Path, url: str | None, records: int, threads: int
) -> tuple[float, float]:
    """``_threads_child`` run in a fresh interpreter importing the sandcell of ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(REPO)])}
    env.pop("SANDCELL_DATABASE_URL", None)
    argv = [sys.executable, __file__, "--child", str(path), "--records", str(records)]
    argv += ["--threads", str(threads)] + (["--url", url] if url else [])
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    imported, rate, cpu_us = out.strip().splitlines()[-3:]
    if not Path(imported).is_relative_to(tree.resolve()):
        raise SystemExit(f"measured the sandcell of {imported}, not of {tree}")
    return float(rate), float(cpu_us)


def _threads_main(args: argparse.Namespace) -> int:
    counts = [int(n) for n in args.threads.split(",")]
    trees = {"this": REPO} | ({"against": Path(args.against).resolve()} if args.against else {})
    samples: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, PostgresServer() as server:
        for r in range(args.rounds):
            for n in counts:
                # Alternating, in a different order each round.
                for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
                    for db in ("sqlite", "postgres"):
                        tag = f"{db}_{n}t_{name}_{r}"
                        path = Path(tmp) / tag / "audit.sqlite3"
                        url = (
                            server.create_database(f"b{uuid.uuid4().hex[:12]}")
                            if db == "postgres"
                            else None
                        )
                        rate, cpu_us = _threads_rate(trees[name], path, url, args.records, n)
                        samples.setdefault(f"{db}_{n}t_{name}", []).append(rate)
                        samples.setdefault(f"{db}_{n}t_{name}_cpu_us", []).append(cpu_us)
    figures = {key: statistics.median(values) for key, values in samples.items()}
    if args.json:
        load = {"before": load_before, "after": os.getloadavg()}
        print(json.dumps({"median": figures, "samples": samples, "load": load}, indent=2))
        return 0
    for db in ("sqlite", "postgres"):
        for n in counts:
            now, cpu = figures[f"{db}_{n}t_this"], figures[f"{db}_{n}t_this_cpu_us"]
            line = f"{db:8s} {n} thread(s): {now:7.0f}/s {cpu:5.0f} us CPU/append"
            if args.against:
                then = figures[f"{db}_{n}t_against"]
                then_cpu = figures[f"{db}_{n}t_against_cpu_us"]
                line += (
                    f"  against {then:7.0f}/s {then_cpu:5.0f} us"
                    f"  ratio {now / then:.2f}x rate, {cpu / then_cpu:.2f}x CPU"
                )
            print(line)
    print(
        f"median of {args.rounds} round(s); load average {load_before} before, "
        f"{os.getloadavg()} after"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--threads", help="thread counts of one process, e.g. 1,2,4,8")
    parser.add_argument("--against", help="another sandcell checkout, measured alternately")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        import sandcell

        print(Path(sandcell.__file__).resolve())  # which tree's sandcell was measured
        rate, cpu_us = _threads_child(Path(args.child), args.url, args.records, int(args.threads))
        print(rate)
        print(cpu_us)
        return 0
    if args.threads:
        return _threads_main(args)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, PostgresServer() as server:
        for writers in (1, args.writers):
            sqlite = Path(tmp) / f"sqlite-{writers}" / "audit.sqlite3"
            # Spawned children start by importing sandcell: measured once, not per record.
            figures[f"sqlite_{writers}"] = _rate(sqlite, None, args.records, writers)
            url = server.create_database(f"bench_{writers}_{uuid.uuid4().hex[:8]}")
            pg_home = Path(tmp) / f"pg-{writers}" / "audit.sqlite3"
            figures[f"postgres_{writers}"] = _rate(pg_home, url, args.records, writers)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for writers in (1, args.writers):
        lite, pg = figures[f"sqlite_{writers}"], figures[f"postgres_{writers}"]
        print(
            f"{writers} writer(s): SQLite {lite:7.0f}/s  PostgreSQL {pg:7.0f}/s  "
            f"PostgreSQL/SQLite {pg / lite:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
