"""Issue 27's first target on the upper rungs: a pooled ``console.log(1)`` against a pooled
``print(1)`` on gVisor and on the microVM, in one run.

    .venv/bin/python bench/bench_js_upper_rungs.py [--rungs gvisor,microvm] [--runs N]
        [--settle SECONDS]

``bench/bench_js.py`` measures the namespaces rung, which has a pool of waiting Node sandboxes.
Here each rung's executor runs with ``WarmConfig(mode="pool")`` and the two programs alternate:
Python takes the rung's pool (gVisor's waiting ``runsc`` sandboxes, the microVM's VMs restored
from a snapshot); JavaScript takes whatever that rung gives a Node program (gVisor: a cold
sandbox, its pool is Python's; the microVM: a pooled VM whose runner starts Node in the guest).
After each run the script waits ``--settle`` seconds so that the pool is full again and every
Python run is a pooled start (the start modes seen are printed). Medians of ``Executor.run`` end
to end; the ratio is JavaScript over Python. Profile ``unchecked``; records in a temporary home.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandcell import Executor, RunRequest
from sandcell.backends.warm import WarmConfig

_PROGRAMS = {
    "python": RunRequest(code="print(1)"),
    "javascript": RunRequest(code="console.log(1)", language="javascript"),
}


def measure(backend: str, runs: int, settle_s: float, home: Path) -> None:
    ex = Executor(
        home=home / backend,
        profile="unchecked",
        backend=backend,
        warm=WarmConfig(mode="pool", pool_size=2),
    )
    times: dict[str, list[float]] = {lang: [] for lang in _PROGRAMS}
    starts: dict[str, set[str]] = {lang: set() for lang in _PROGRAMS}
    try:
        for i in range(runs + 2):  # the first two of each warm the pool and the page cache
            for lang, request in _PROGRAMS.items():
                t0 = time.perf_counter()
                result = ex.run(request)
                elapsed_ms = (time.perf_counter() - t0) * 1000
                if result.stdout != "1\n":
                    raise SystemExit(f"{backend} {lang}: {result.outcome} {result.stderr[-400:]}")
                start = result.start
                starts[lang].add(start.mode if start is not None else "?")
                if i >= 2:
                    times[lang].append(elapsed_ms)
                time.sleep(settle_s)
    finally:
        ex.close()
    py = statistics.median(times["python"])
    js = statistics.median(times["javascript"])
    print(
        f"{backend}: pooled print(1) {py:.1f} ms ({'/'.join(sorted(starts['python']))}), "
        f"console.log(1) {js:.1f} ms ({'/'.join(sorted(starts['javascript']))}): "
        f"{js / py:.2f}x over {runs} runs each"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", default="gvisor,microvm")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--settle", type=float, default=4.0, help="seconds after each run")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-js-upper-"))
    try:
        for backend in args.rungs.split(","):
            measure(backend.strip(), args.runs, args.settle, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
