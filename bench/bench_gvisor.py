"""gVisor: bare ``runsc run`` of python against sandcell's gVisor backend, cold and warm (pool).

    .venv/bin/python bench/bench_gvisor.py [--runs N] [--pandas]

Run as root (or as an ordinary user: rootless runsc, the ``rlimits`` mode). Measures, in one
process and interleaved round by round so that load from other work hits every variant alike:

* ``bare runsc``: ``runsc run`` of ``python -I -c CODE`` (sandcell's interpreter and packages)
  on a minimal bundle (read-only root, ``/usr`` and the venv bound, no network): the floor of
  any gVisor sandbox here;
* ``gvisor cold``: ``GVisorBackend().run`` (a new sandbox per run: bundle, tmpfs workspace,
  cgroup, agent, boot, teardown);
* ``gvisor pool``: ``GVisorBackend(warm=WarmConfig(mode="pool"))`` (a sandbox started ahead,
  used once); with ``--pandas`` its preload is numpy and pandas and the program imports pandas.

Prints medians and 90th percentiles in ms and the ratios cold/bare and pool/cold (the issue's
target: a warm run at most a third of a cold one). Each pooled run is followed by a pause long
enough for the refill, so that the pool is measured ready, as a steady trickle of runs sees it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sandcell import RunRequest, WarmConfig
from sandcell.backends.gvisor import GVisorBackend, runsc

PRINT = "print(1)"
PANDAS = "import pandas as pd; print(pd.DataFrame({'a':[1,2,3]}).sum().to_dict())"


def _bare_bundle(rs: runsc.Runsc, code: str) -> Path:
    bundle = Path(tempfile.mkdtemp(prefix="bench-gvisor-"))
    venv = os.path.abspath(sys.prefix)
    # The probe's bundle, running sandcell's own interpreter and packages (its venv bound at its
    # host path) with a writable /tmp.
    runsc.write_bare_bundle(
        bundle,
        rs,
        [os.path.join(venv, "bin", "python"), "-I", "-c", code],
        env=["PATH=/usr/bin"],
        cwd="/tmp",
        mounts=[
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["size=64m"]},
            {"destination": venv, "type": "bind", "source": venv, "options": ["rbind", "ro"]},
        ],
    )
    bundle.chmod(0o755)
    return bundle


def _bare(rs: runsc.Runsc, bundle: Path) -> Callable[[], float]:
    def run() -> float:
        cid = f"bench-{uuid.uuid4().hex[:12]}"
        t0 = time.perf_counter()
        out = subprocess.run(
            rs.argv("run", "--bundle", str(bundle), cid),
            capture_output=True,
            env={},
            stdin=subprocess.DEVNULL,
            check=False,
        )
        elapsed = (time.perf_counter() - t0) * 1000
        if out.returncode != 0:
            raise RuntimeError(f"bare runsc failed: {out.stderr.decode()[-500:]}")
        return elapsed

    return run


def _backend(backend: GVisorBackend, code: str, *, settle_s: float = 0.0) -> Callable[[], float]:
    request = RunRequest(code=code)

    def run() -> float:
        t0 = time.perf_counter()
        result = backend.run(request, run_id=uuid.uuid4().hex, collect=lambda _ws: ((), ()))
        elapsed = (time.perf_counter() - t0) * 1000
        if result.outcome.value != "ok":
            raise RuntimeError(f"{result.outcome}: {result.reason} {result.stderr[-500:]!r}")
        time.sleep(settle_s)
        return elapsed

    return run


def _summary(times: list[float]) -> tuple[float, str]:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
    med = statistics.median(times)
    return med, f"median {med:7.1f} ms   p90 {p90:7.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--pandas", action="store_true", help="a pandas program, pandas preloaded")
    args = ap.parse_args()
    code = PANDAS if args.pandas else PRINT
    preload = ("numpy", "pandas") if args.pandas else ()
    cold = GVisorBackend()
    pool = GVisorBackend(warm=WarmConfig(mode="pool", preload=preload, pool_size=2))
    rs = cold.runsc
    bundle = _bare_bundle(rs, code)
    # The refill of a pandas sandbox takes seconds under ptrace; wait for it between pooled runs.
    settle = 4.0 if args.pandas else 1.0
    variants = {
        "bare runsc run": _bare(rs, bundle),
        "gvisor cold": _backend(cold, code),
        "gvisor pool": _backend(pool, code, settle_s=settle),
    }
    print(f"{rs.describe()}; program: {code!r}; preload: {preload}; runs: {args.runs}")
    print(f"load average at start: {os.getloadavg()}")
    deadline = time.monotonic() + 300
    while (stats := pool.warm_stats()) is not None and getattr(stats, "ready", 0) < 2:
        if time.monotonic() > deadline:
            sys.exit("the pool did not fill within 300 s")
        time.sleep(0.2)
    for run in variants.values():  # warm-up: caches, first imports
        run()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in range(args.runs):
            for key, run in variants.items():
                samples[key].append(run())
    finally:
        cold.close()
        pool.close()
        shutil.rmtree(bundle, ignore_errors=True)
    medians: dict[str, float] = {}
    for key, times in samples.items():
        medians[key], text = _summary(times)
        print(f"{key:16s} {text}")
    bare, c, p = medians["bare runsc run"], medians["gvisor cold"], medians["gvisor pool"]
    print(f"cold / bare runsc: {c / bare:.2f}x")
    verdict = "met" if p / c <= 1 / 3 else "NOT met"
    print(f"pool / cold:       {p / c:.2f}x  (target <= 0.33: {verdict})")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
