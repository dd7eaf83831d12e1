"""Benchmark: what a fresh sandcell sandbox costs per run, against same-run baselines.

Usage::

    .venv/bin/python bench/bench_exec.py [--runs N] [--throughput-runs M] [--json]

Variants, each running the same program with the interpreter sandcell uses
(``sandcell.runtimes.python_runtime().interpreter``):

``python``
    bare interpreter: ``subprocess.run([python, "-I", "-c", code])`` from Python;
``bwrap``
    bare bubblewrap (the binary sandcell uses) with a comparable minimal sandbox: every namespace,
    the runtime's directories read-only, its root symlinks, ``/proc``, ``/dev``, a tmpfs ``/tmp``;
``sandcell``
    ``Executor.run`` through the Python API, default strict mode (cgroups, seccomp, Landlock, the
    run record in the audit log);
``sandcell-noll``
    the same with ``RunRequest(landlock=False)``: the difference to ``sandcell`` is the boot's
    Landlock step.

Workloads: a no-op (``pass``), a small CPU loop and a pandas groupby. Latency rounds interleave
the variants in a shuffled order per round, so drift on a noisy machine hits all of them alike.
Throughput: fresh no-op runs at concurrency 1 and 2, threads each doing ``subprocess.run`` (bwrap)
or ``Executor.run`` on one shared Executor (sandcell), in alternating chunks.

Records and run directories go to a temporary ``SANDCELL_HOME``/``SANDCELL_RUNS``, removed at the
end; the user's audit log is not touched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

# Set before sandcell is imported or an Executor is built: nothing of the user's is touched.
_HOME = tempfile.mkdtemp(prefix="sandcell-bench-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _common import Runner, bwrap_argv, python_argv, subprocess_runner  # noqa: E402
from _common import run_pool as _pool  # noqa: E402
from _stats import p90  # noqa: E402

from sandcell import Executor, Outcome, RunRequest  # noqa: E402
from sandcell.backends.host.bubblewrap import find_bwrap  # noqa: E402
from sandcell.runtimes import python_runtime  # noqa: E402

WORKLOADS: dict[str, str] = {
    "noop": "pass",
    "cpu": "sum(range(3_000_000))",
    "pandas": (
        "import pandas as pd\n"
        "df = pd.DataFrame({'k': [i % 10 for i in range(1000)], 'v': range(1000)})\n"
        "m = df.groupby('k')['v'].mean()\n"
        "assert len(m) == 10\n"
    ),
}
VARIANTS = ("python", "bwrap", "sandcell", "sandcell-noll")


# -- the variants ------------------------------------------------------------------------------


def sandcell_runner(ex: Executor, code: str, *, landlock: bool | None = None) -> Runner:
    request = RunRequest(code=code, landlock=landlock)

    def run() -> None:
        r = ex.run(request)
        if r.outcome is not Outcome.OK:
            raise RuntimeError(f"sandcell run {r.outcome.value}: {r.reason}: {r.stderr[-500:]}")

    return run


def runners(ex: Executor, code: str) -> dict[str, Runner]:
    return {
        "python": subprocess_runner(python_argv(code)),
        "bwrap": subprocess_runner(bwrap_argv(code)),
        "sandcell": sandcell_runner(ex, code),
        "sandcell-noll": sandcell_runner(ex, code, landlock=False),
    }


# -- measuring ---------------------------------------------------------------------------------


def _time(run: Runner) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1000


def latency(
    ex: Executor, code: str, *, runs: int, warmup: int, rng: random.Random
) -> dict[str, list[float]]:
    rs = runners(ex, code)
    for _ in range(warmup):
        for run in rs.values():
            run()
    samples: dict[str, list[float]] = {v: [] for v in rs}
    order = list(rs)
    for _ in range(runs):
        rng.shuffle(order)
        for v in order:
            samples[v].append(_time(rs[v]))
    return samples


def throughput(ex: Executor, *, total: int, concurrency: int, chunks: int = 4) -> dict[str, float]:
    """Runs per second for bwrap and sandcell; chunks alternate between the two variants."""
    rs = {"bwrap": subprocess_runner(bwrap_argv("pass")), "sandcell": sandcell_runner(ex, "pass")}
    for run in rs.values():
        _pool(run, 2 * concurrency, concurrency)  # warm up
    per_chunk = [total // chunks + (1 if i < total % chunks else 0) for i in range(chunks)]
    elapsed = dict.fromkeys(rs, 0.0)
    for i, n in enumerate(per_chunk):
        order = list(rs) if i % 2 == 0 else list(reversed(rs))
        for v in order:
            elapsed[v] += _pool(rs[v], n, concurrency)
    return {v: total / s for v, s in elapsed.items()}


# -- reporting ---------------------------------------------------------------------------------


def summarize(samples: dict[str, list[float]]) -> dict[str, Any]:
    stats = {
        v: {
            "n": len(xs),
            "median_ms": statistics.median(xs),
            "p90_ms": p90(xs),
            "min_ms": min(xs),
        }
        for v, xs in samples.items()
    }
    med = {v: s["median_ms"] for v, s in stats.items()}
    return {
        "variants": stats,
        "sandcell_over_bwrap": med["sandcell"] / med["bwrap"],
        "sandcell_over_python": med["sandcell"] / med["python"],
        "sandcell_cost_ms": med["sandcell"] - med["bwrap"],
        "sandcell_cost_pct": (med["sandcell"] - med["bwrap"]) / med["bwrap"] * 100,
        "sandcell_noll_cost_ms": med["sandcell-noll"] - med["bwrap"],
        "landlock_boot_ms": med["sandcell"] - med["sandcell-noll"],
        "bwrap_over_python_ms": med["bwrap"] - med["python"],
    }


def print_latency(name: str, code: str, s: dict[str, Any]) -> None:
    print(f"\n== latency: {name}  ({code.strip().splitlines()[-1][:60]!r}...)")
    print(f"{'variant':<15}{'n':>5}{'median ms':>12}{'p90 ms':>10}{'min ms':>10}")
    for v, st in s["variants"].items():
        print(
            f"{v:<15}{st['n']:>5}{st['median_ms']:>12.1f}{st['p90_ms']:>10.1f}{st['min_ms']:>10.1f}"
        )
    print(
        f"sandcell/bwrap = {s['sandcell_over_bwrap']:.2f}x   "
        f"sandcell/python = {s['sandcell_over_python']:.2f}x   "
        f"bwrap-python = {s['bwrap_over_python_ms']:+.1f} ms"
    )
    print(
        f"sandcell own cost = {s['sandcell_cost_ms']:+.1f} ms/run "
        f"({s['sandcell_cost_pct']:+.0f}% over bwrap); "
        f"without Landlock {s['sandcell_noll_cost_ms']:+.1f} ms; "
        f"Landlock boot step {s['landlock_boot_ms']:+.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs",
        type=int,
        default=80,
        help="measured rounds for the no-op (the CPU loop gets N/2, pandas N/5; default 80)",
    )
    ap.add_argument(
        "--throughput-runs", type=int, default=100, help="runs per throughput measurement"
    )
    ap.add_argument("--json", action="store_true", help="also print a JSON summary at the end")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    bw = find_bwrap()
    rt = python_runtime()
    bw_version = subprocess.run(
        [bw.path, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "runtime_interpreter": rt.interpreter,
        "bwrap": f"{bw_version} ({bw.source}: {bw.path})",
    }
    print("sandcell exec benchmark")
    for k, v in meta.items():
        print(f"{k:<20}{v}")

    t_start = time.perf_counter()
    results: dict[str, Any] = {"meta": meta, "latency": {}, "throughput": {}}
    with Executor(profile="analysis") as ex:
        rounds = {
            "noop": max(3, args.runs),
            "cpu": max(3, args.runs // 2),
            "pandas": max(3, args.runs // 5),
        }
        for name, code in WORKLOADS.items():
            samples = latency(
                ex, code, runs=rounds[name], warmup=2 if name == "pandas" else 3, rng=rng
            )
            s = summarize(samples)
            results["latency"][name] = s
            print_latency(name, code, s)

        print(f"\n== throughput: fresh no-op runs, {args.throughput_runs} per cell")
        head = ("concurrency", "bwrap runs/s", "sandcell runs/s", "sandcell/bwrap")
        print(f"{head[0]:<13}{head[1]:>14}{head[2]:>17}{head[3]:>16}")
        for c in (1, 2):
            tp = throughput(ex, total=args.throughput_runs, concurrency=c)
            ratio = tp["sandcell"] / tp["bwrap"]
            results["throughput"][str(c)] = {
                "bwrap_runs_per_s": tp["bwrap"],
                "sandcell_runs_per_s": tp["sandcell"],
                "sandcell_over_bwrap": ratio,
            }
            print(f"{c:<13}{tp['bwrap']:>14.1f}{tp['sandcell']:>17.1f}{ratio:>16.2f}")
        results["audit_records"] = ex.audit.count()
    results["elapsed_s"] = time.perf_counter() - t_start
    print(f"\n(total {results['elapsed_s']:.0f} s, {results['audit_records']} sandcell runs)")
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(_HOME, ignore_errors=True)
