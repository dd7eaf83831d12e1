"""Warm starts against cold ones: latency of a trivial and a pandas snippet, and idle memory.

    .venv/bin/python bench/bench_warm.py [--runs N] [--preload numpy,pandas]

Measures, in one process and interleaved: the backend call (``NamespacesBackend.run``, no
policy or record) for ``cold``, ``template`` and ``pool`` starts, then the idle memory of a
pooled sandbox (PSS and USS of its two processes). Medians and 90th percentiles in ms. The full
comparative suite lives in ``bench/compare.py``; this is the quick check of the warm paths.

API for other benchmarks: ``NamespacesBackend(warm=WarmConfig(mode="template"|"pool",
preload=(...), pool_size=N))``; ``backend.run(RunRequest(code=...), run_id=..., collect=...)``
returns a ``BackendResult`` whose ``start`` says how it started; ``backend.warm_stats()`` gives
the template's pid and state and ``PoolStats`` (ready, forked, idle PSS/USS bytes).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

from sandcell import RunRequest, WarmConfig
from sandcell.backends.namespaces import NamespacesBackend

PRINT = "print(1)"
PANDAS = "import pandas as pd; print(pd.DataFrame({'a':[1,2,3]}).sum().to_dict())"
MiB = 1024 * 1024


def _runner(backend: NamespacesBackend, code: str) -> Callable[[], float]:
    request = RunRequest(code=code)

    def run() -> float:
        t0 = time.perf_counter()
        result = backend.run(request, run_id=uuid.uuid4().hex, collect=lambda _ws: ((), ()))
        elapsed = (time.perf_counter() - t0) * 1000
        if result.outcome.value != "ok":
            raise RuntimeError(f"{result.outcome}: {result.reason} {result.stderr[-500:]!r}")
        return elapsed

    return run


def _summary(times: list[float]) -> str:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
    return f"median {statistics.median(times):7.1f} ms   p90 {p90:7.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--preload", default="numpy,pandas")
    ap.add_argument("--pool-size", type=int, default=4)
    args = ap.parse_args()
    preload = tuple(m for m in args.preload.split(",") if m)
    backends = {
        "cold": NamespacesBackend(),
        "template": NamespacesBackend(warm=WarmConfig(mode="template", preload=preload)),
        "pool": NamespacesBackend(
            warm=WarmConfig(mode="pool", preload=preload, pool_size=args.pool_size)
        ),
    }
    try:
        for name, code in (("print(1)", PRINT), ("pandas", PANDAS)):
            runners = {k: _runner(b, code) for k, b in backends.items()}
            for run in runners.values():  # warm-up: template preload, pool fill, page cache
                run()
            times: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(args.runs):
                for k, run in runners.items():  # interleaved, so load shifts hit all alike
                    if k == "pool":
                        _wait_for_pool(backends["pool"], args.pool_size)
                    times[k].append(run())
            for k, t in times.items():
                print(f"{name:9} {k:9} {_summary(t)}")
        _wait_for_pool(backends["pool"], args.pool_size)
        stats = backends["pool"].warm_stats()
        assert stats is not None and stats.pool is not None
        n = max(stats.pool.ready, 1)
        print(
            f"idle pooled sandbox ({','.join(preload) or 'nothing'} preloaded): "
            f"PSS {stats.pool.idle_pss_bytes / n / MiB:.1f} MiB, "
            f"USS {stats.pool.idle_uss_bytes / n / MiB:.1f} MiB; "
            f"template PSS {stats.template_pss_bytes / MiB:.1f} MiB"
        )
    finally:
        for b in backends.values():
            b.close()


def _wait_for_pool(backend: NamespacesBackend, size: int, timeout_s: float = 60.0) -> None:
    """Measure a full pool's take, not the refill racing the next run (2 cores)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = backend.warm_stats()
        if stats is not None and stats.pool is not None and stats.pool.ready >= size:
            return
        time.sleep(0.005)


if __name__ == "__main__":
    main()
