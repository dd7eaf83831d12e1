"""Benchmark: sandcell against what users would pick instead, measured in one run, as ratios.

Usage::

    .venv/bin/python bench/compare.py [--quick] [--json FILE] [--markdown FILE]
        [--variants python,bwrap,...] [--workloads noop,cpu,pandas] [--concurrency 1,2,4]
        [--skip latency,throughput,memory]

The alternatives come with ``pip install -e '.[bench]'``; a missing one is reported, not skipped.

Variants (see ``_variants.py``): bare ``python -I -c``; bare bubblewrap + python; sandcell cold,
warm pool and template fast path (profile ``unchecked``: the sandbox alone, every isolation layer
and limit); llm-sandbox's bubblewrap backend, sessions reused and a new session per run;
smolagents' ``LocalPythonExecutor``, for reference only: it is NOT an isolation boundary. All
sandboxes run the interpreter sandcell uses, with the same bwrap binary.

Measured, each on a quiet start (variants interleaved so a noisy machine's drift hits all alike):

- latency from call to result per workload: median and p90, and the median over bare python's;
- throughput: runs/s with 1, 2 and 4 callers back to back for a fixed time per cell, and the rate
  over bare python's at the same concurrency;
- idle memory (PSS) per ready sandbox: sandcell's pool and template, against separate
  interpreters that imported the same modules.

Records and run directories go to a temporary ``SANDCELL_HOME``, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Set before sandcell is imported or an Executor is built: nothing of the user's is touched.
_HOME = tempfile.mkdtemp(prefix="sandcell-compare-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _common import interleaved_latency, timed_pool  # noqa: E402
from _machine import machine_info  # noqa: E402
from _memory import separate_interpreters, warm_sandboxes  # noqa: E402
from _report import render_report  # noqa: E402
from _results import (  # noqa: E402
    LatencyCell,
    MemoryRow,
    Results,
    ThroughputCell,
    VariantInfo,
    results_from_dict,
    results_to_dict,
)
from _stats import latency_stats  # noqa: E402
from _variants import ALL_VARIANTS, Variant, build_variant  # noqa: E402

WORKLOADS: dict[str, tuple[str, str]] = {
    # name: (code, what it must print)
    "noop": ("print(1)", "1"),
    "cpu": ("print(sum(i * i for i in range(100_000)))", "333328333350000"),
    "pandas": (
        "import pandas as pd; print(pd.DataFrame({'a':[1,2,3]}).sum().to_dict())",
        "{'a': 6}",
    ),
}
BASELINE = "python"


def _csv(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return items

    return parse


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers like 1,2,4") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers like 1,2,4")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--variants", type=_csv(ALL_VARIANTS), default=ALL_VARIANTS)
    ap.add_argument("--workloads", type=_csv(tuple(WORKLOADS)), default=tuple(WORKLOADS))
    ap.add_argument(
        "--throughput-workloads",
        type=_csv(tuple(WORKLOADS)),
        default=("noop", "cpu"),
        help="workloads measured for throughput (default noop,cpu)",
    )
    ap.add_argument("--concurrency", type=_ints, default=(1, 2, 4))
    ap.add_argument(
        "--skip", type=_csv(("latency", "throughput", "memory")), default=(), help="phases to skip"
    )
    ap.add_argument("--runs", type=int, default=30, help="latency rounds for noop and cpu")
    ap.add_argument("--pandas-runs", type=int, default=10, help="latency rounds for pandas")
    ap.add_argument(
        "--cell-budget-s",
        type=float,
        default=5.0,
        help="a variant stops a latency cell after this much time (with at least 3 samples)",
    )
    ap.add_argument("--tp-seconds", type=float, default=2.0, help="seconds per throughput cell")
    ap.add_argument("--pool-size", type=int, default=4, help="sandcell warm pool size")
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke run (~1 min)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    ap.add_argument("--markdown", type=Path, metavar="FILE", help="write the report as Markdown")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: print (and --markdown) the report of an earlier --json FILE",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.pandas_runs = min(args.runs, 8), min(args.pandas_runs, 3)
        args.cell_budget_s, args.tp_seconds = min(args.cell_budget_s, 2.0), 1.0
    return args


def _versions() -> dict[str, str]:
    from sandcell.backends.host.bubblewrap import find_bwrap

    bw = find_bwrap()
    out = subprocess.run([bw.path, "--version"], capture_output=True, text=True, check=False)
    commit = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent), "status", "--porcelain", "-uno"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "sandcell": f"{commit or 'unknown commit'}{' + uncommitted changes' if dirty else ''}",
        "bwrap": f"{out.stdout.strip()} ({bw.source})",
    }


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_latency(
    variants: dict[str, Variant], args: argparse.Namespace, rng: random.Random
) -> list[LatencyCell]:
    cells = []
    for name in args.workloads:
        code, expect = WORKLOADS[name]
        rounds = args.pandas_runs if name == "pandas" else args.runs
        _log(f"latency: {name} ({rounds} rounds)")
        runners = {k: v.runner(code, expect) for k, v in variants.items()}
        warm: dict[str, BaseException] = {}
        for key, run in runners.items():
            try:
                run()  # not timed: first-use costs (page cache, imports) are not the steady state
            except Exception as exc:
                warm[key] = exc
        good = {k: r for k, r in runners.items() if k not in warm}
        got = interleaved_latency(good, rounds=rounds, budget_s=args.cell_budget_s, rng=rng)
        for key in runners:
            res = warm.get(key) or got[key]
            if isinstance(res, BaseException):
                cells.append(LatencyCell(key, name, None, f"{type(res).__name__}: {res}"))
            else:
                cells.append(LatencyCell(key, name, latency_stats(res)))
    return cells


def measure_throughput(
    variants: dict[str, Variant], args: argparse.Namespace, rng: random.Random
) -> list[ThroughputCell]:
    cells = []
    for name in args.throughput_workloads:
        code, expect = WORKLOADS[name]
        for c in args.concurrency:
            _log(f"throughput: {name} at concurrency {c}")
            order = list(variants)
            rng.shuffle(order)
            runs = dict.fromkeys(order, 0)
            secs = dict.fromkeys(order, 0.0)
            failed: dict[str, str] = {}
            runners = {k: variants[k].runner(code, expect) for k in order}
            # Two halves, the second in reverse order: drift over the cell hits every variant alike.
            for half in (order, order[::-1]):
                for key in half:
                    if key in failed:
                        continue
                    try:
                        timed_pool(runners[key], workers=c, seconds=0, min_runs=c)  # warm-up
                        n, s = timed_pool(
                            runners[key], workers=c, seconds=args.tp_seconds / 2, min_runs=c
                        )
                    except Exception as exc:
                        failed[key] = f"{type(exc).__name__}: {exc}"
                        continue
                    runs[key] += n
                    secs[key] += s
            for key in variants:
                err = failed.get(key)
                cells.append(ThroughputCell(key, name, c, runs[key], secs[key], err))
    return cells


def measure_memory(args: argparse.Namespace) -> list[MemoryRow]:
    _log("memory: idle interpreters and sandboxes")
    rows = [separate_interpreters(args.pool_size)]
    for mode in ("pool", "template"):
        if f"sandcell-{mode}" in args.variants:
            rows.append(
                warm_sandboxes(mode, home=Path(_HOME) / f"mem-{mode}", pool_size=args.pool_size)
            )
    if any(v.startswith("llm-sandbox") for v in args.variants):
        note = "keeps no process between runs: every run starts its interpreter cold"
        rows.append(MemoryRow("llm-sandbox, bubblewrap backend", 0, 0, None, note))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        results = results_from_dict(json.loads(args.from_json.read_text()))
        _output(results, args)
        return 0
    rng = random.Random(args.seed)
    meta = {**machine_info(), **_versions()}
    _log("sandcell compare: " + ", ".join(f"{k}={v}" for k, v in meta.items()))
    t0 = time.perf_counter()

    infos: list[VariantInfo] = []
    variants: dict[str, Variant] = {}
    for key in args.variants:
        _log(f"setting up {key}")
        v = build_variant(key, home=Path(_HOME), pool_size=args.pool_size)
        if isinstance(v, VariantInfo):
            infos.append(v)
        else:
            variants[key] = v
    latency: list[LatencyCell] = []
    throughput: list[ThroughputCell] = []
    try:
        if "latency" not in args.skip:
            latency = measure_latency(variants, args, rng)
        if "throughput" not in args.skip:
            throughput = measure_throughput(variants, args, rng)
    finally:
        for v in variants.values():
            v.close()
    memory = [] if "memory" in args.skip else measure_memory(args)

    # The final infos carry what was seen while measuring (sandcell's start modes).
    by_key = {i.key: i for i in infos} | {k: v.info for k, v in variants.items()}
    meta["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta["elapsed"] = f"{time.perf_counter() - t0:.0f} s"
    results = Results(
        meta=meta,
        variants=tuple(by_key[k] for k in args.variants),
        workloads={
            w: WORKLOADS[w][0] for w in dict.fromkeys((*args.workloads, *args.throughput_workloads))
        },
        latency=tuple(latency),
        throughput=tuple(throughput),
        memory=tuple(memory),
        baseline=BASELINE,
    )
    _output(results, args)
    return 0


def _output(results: Results, args: argparse.Namespace) -> None:
    print(render_report(results, markdown=False))
    if args.json:
        args.json.write_text(json.dumps(results_to_dict(results), indent=2) + "\n")
        _log(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(render_report(results, markdown=True))
        _log(f"wrote {args.markdown}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(_HOME, ignore_errors=True)
