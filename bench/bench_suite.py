"""Benchmark: the test suite's time, chunk by chunk, against a base tree, runs alternated.

Usage::

    .venv/bin/python bench/bench_suite.py --base /tmp/base-worktree [--pairs 2]
        [--json FILE] [--pytest-args="-n 2"] CHUNK [CHUNK ...]

A CHUNK is what ``pytest`` is given (a directory, a file, a node id; several joined with ``+``:
``tests/unit/test_approvals.py+tests/unit/test_agent_paused.py``). Each chunk runs ``--pairs``
times in each tree, base and this checkout alternating (which goes first alternates too), so a
machine that gets busier or quieter meanwhile weighs on both alike. ``--base`` is a checkout of
the tree to compare with (``git worktree add /tmp/base <commit>``), run with its own ``src`` first
on ``PYTHONPATH`` and this checkout's interpreter. ``--base .`` with ``--pytest-args`` compares
one tree with itself under other pytest options (``-n 2`` with pytest-xdist installed).

For each run: the wall time, the tests that passed, failed and were skipped, and the sum of the
reported setup, call and teardown durations (``--durations=0``, so the collection is out of
it); the load average when it ended. The summary gives, per chunk, the median wall time of each
tree and their ratio (this checkout over base), with the load range: the host has two cores
and is shared, so a ratio from runs minutes apart under other load is the figure to trust.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown) ")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")


@dataclass(frozen=True)
class Run:
    chunk: str
    tree: str
    wall_s: float
    phases_s: dict[str, float]
    counts: dict[str, int]
    load: float
    rc: int


def run_chunk(chunk: str, tree: Path, label: str, extra: list[str], basetemp: Path) -> Run:
    """One pytest run of ``chunk`` in ``tree``; its figures from pytest's own report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)])}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *chunk.split("+"),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={basetemp}",
        "--durations=0",
        "--durations-min=0",
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    phases = {"setup": 0.0, "call": 0.0, "teardown": 0.0}
    for line in proc.stdout.splitlines():
        found = _DURATION.match(line)
        if found:
            phases[found.group(2)] += float(found.group(1))
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0:
        # A failed run's figures mean little without why: its output is kept next to the temp.
        kept = basetemp.with_name(f"{basetemp.name}-{label}-{int(time.time())}.log")
        kept.write_text(proc.stdout + proc.stderr)
        print(f"{chunk} {label}: exit {proc.returncode}, output in {kept}", flush=True)
    counts = {kind.rstrip("s"): int(n) for n, kind in _COUNT.findall(summary)}
    return Run(
        chunk=chunk,
        tree=label,
        wall_s=round(wall, 2),
        phases_s={k: round(v, 2) for k, v in phases.items()},
        counts=counts,
        load=os.getloadavg()[0],
        rc=proc.returncode,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("chunks", nargs="+")
    ap.add_argument("--base", type=Path, required=True, help="checkout of the tree to compare")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--pytest-args", default="", help="more pytest options for this checkout")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = args.base.resolve()
    extra = args.pytest_args.split()
    basetemp = Path(f"/tmp/bench-suite-{os.getpid()}")
    runs: list[Run] = []
    for chunk in args.chunks:
        for i in range(args.pairs):
            order = [("base", base, []), ("new", REPO, extra)]
            if i % 2:
                order.reverse()
            for label, tree, more in order:
                run = run_chunk(chunk, tree, label, more, basetemp)
                runs.append(run)
                print(
                    f"{chunk} {label}: {run.wall_s:.1f} s wall, phases {run.phases_s}, "
                    f"{run.counts}, load {run.load:.1f}, rc {run.rc}",
                    flush=True,
                )
    print("\nchunk: median wall base -> new (new/base), load range")
    for chunk in args.chunks:
        mine = [r for r in runs if r.chunk == chunk]
        walls = {
            t: statistics.median(r.wall_s for r in mine if r.tree == t) for t in ("base", "new")
        }
        loads = [r.load for r in mine]
        print(
            f"{chunk}: {walls['base']:.1f} s -> {walls['new']:.1f} s "
            f"({walls['new'] / walls['base']:.2f}), load {min(loads):.1f}-{max(loads):.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    return 0 if all(r.rc in (0, 1) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
