"""Profile sandcell's host side on a pooled no-op and a cold no-op, for py-spy or perf.

Usage::

    .venv/bin/py-spy record --idle -r 500 -f raw -o /tmp/pool.txt -- \\
        .venv/bin/python bench/profile_hot_path.py --mode pool --runs 300
    .venv/bin/py-spy record --idle -r 500 -f raw -o /tmp/cold.txt -- \\
        .venv/bin/python bench/profile_hot_path.py --mode cold --runs 150
    .venv/bin/python bench/profile_summary.py /tmp/pool.txt

Also prints the host CPU per run (this process, all threads: ``time.process_time``) and the
caller thread's alone (``time.thread_time``), medians over the measured runs; the set-up (pool
start, first run) is left out of both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HOME = tempfile.mkdtemp(prefix="sandcell-prof-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("pool", "pool-bare", "cold"), default="pool")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()

    from sandcell import Executor, RunRequest
    from sandcell.backends.warm import WarmConfig

    if args.mode == "cold":
        ex = Executor(home=Path(_HOME), profile="unchecked")
    else:
        preload: tuple[str, ...] = () if args.mode == "pool-bare" else ("numpy", "pandas")
        cfg = WarmConfig(mode="pool", preload=preload, pool_size=args.pool_size)
        ex = Executor(home=Path(_HOME), profile="unchecked", warm=cfg)
    req = RunRequest(code="pass")
    with ex:
        first = ex.run(req)
        if args.mode != "cold" and first.start.mode != "pool":
            sys.exit(f"the first run started as {first.start.mode!r}, not from the pool")
        proc: list[float] = []
        thread: list[float] = []
        wall: list[float] = []
        t_start = os.times()
        for _ in range(args.runs):
            p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            r = ex.run(req)
            wall.append(time.perf_counter() - w0)
            thread.append(time.thread_time() - t0)
            proc.append(time.process_time() - p0)
            if not r.ok:
                sys.exit(f"run ended {r.outcome}: {r.stderr[-500:]}")
        t_end = os.times()
    user = (t_end.user - t_start.user) / args.runs
    system = (t_end.system - t_start.system) / args.runs
    # Children reaped by this process (the sandboxes' bwrap and boot, the spawners) count in
    # children_*; the pool's forks of the template are children of the template, not counted.
    kids = (
        t_end.children_user
        - t_start.children_user
        + t_end.children_system
        - t_start.children_system
    ) / args.runs
    ms = 1000.0
    print(
        f"{args.mode}: {args.runs} runs; host CPU per run, all threads: median "
        f"{statistics.median(proc) * ms:.2f} ms (mean {statistics.fmean(proc) * ms:.2f}); "
        f"caller thread {statistics.median(thread) * ms:.2f} ms; "
        f"wall {statistics.median(wall) * ms:.1f} ms"
    )
    print(
        f"  mean per run: user {user * ms:.2f} ms, system {system * ms:.2f} ms; "
        f"reaped children {kids * ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
