"""Benchmark: records appended to the audit log, on SQLite and on PostgreSQL, in one run.

Usage::

    .venv/bin/python bench/bench_store.py [--records 2000] [--writers 4] [--json]

The audit log's append is one transaction that takes the log's write lock (SQLite's
``BEGIN IMMEDIATE``, PostgreSQL's advisory lock of the store), reads the head, inserts the entry
and moves the head: the chain stays one chain, and its writers take turns. This measures what
that costs: ``--records`` appends of a run-sized record (about 2 KiB of JSON) from one process,
then from ``--writers`` processes at once, on a SQLite file under a temporary home and on a
fresh database of a PostgreSQL started here (Debian's, as an ordinary user, over loopback TCP:
``tests/pg_server.py``, with fsync off, so the figure is the database's and Python's work, not
the disk's). Printed: appends per second of each, and PostgreSQL's over SQLite's (the baseline,
measured in the same run). The chain is verified after each.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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
