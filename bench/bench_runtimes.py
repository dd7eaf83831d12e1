"""Runtimes: size on disk, cold and warm start of each, against the default runtime.

    .venv/bin/python bench/bench_runtimes.py [--runs N] [--warm pool|template]
        [--backend namespaces|gvisor|microvm] [--runtimes default,minimal,analysis,datascience]

Run as root (or as an ordinary user: the ``rlimits`` mode). For every runtime that is built here
(``sandcell runtime list``; ``default`` is the environment sandcell runs in):

* ``size``: the bytes and files of its packages (a built runtime's manifest; for ``default``, its
  site-packages walked here: in a development install that holds the test tools too);
* ``cold``: one backend call (``Backend.run``: no policy, no record) of ``import numpy`` where the
  runtime has numpy, else ``pass``, in a sandbox started for it;
* ``warm``: the same program from the runtime's own template or pool (``WarmConfig.runtime``),
  numpy preloaded where the runtime has it.

Medians of ``--runs`` samples taken interleaved, round by round in a shuffled order, so that
load from other work hits every runtime alike; a pooled run waits (untimed) until its pool is
full again. Ratios are against ``default`` measured in the same run. A runtime the backend
cannot serve here (a microVM image not built for it: ``sandcell vm build --runtime NAME``) is
left out with the reason.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from _stats import ratio

from sandcell import RunRequest, WarmConfig
from sandcell.backends.base import Backend
from sandcell.backends.registry import create_backend
from sandcell.errors import SandcellError
from sandcell.runtimes.store import find
from sandcell.spec import DEFAULT_RUNTIME

MiB = 1024 * 1024
RUNTIMES = ("default", "minimal", "analysis", "datascience")


@dataclass(frozen=True, slots=True)
class Subject:
    name: str
    size_bytes: int
    files: int
    has_numpy: bool

    @property
    def code(self) -> str:
        return "import numpy" if self.has_numpy else "pass"


def _default_subject() -> Subject:
    size = files = 0
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                st = os.lstat(os.path.join(dirpath, n))
                size, files = size + st.st_size, files + 1
    return Subject(DEFAULT_RUNTIME, size, files, has_numpy=True)


def _subject(name: str) -> Subject:
    if name == DEFAULT_RUNTIME:
        return _default_subject()
    m = find(name).manifest
    return Subject(name, m.size_bytes, m.files, has_numpy="numpy" in m.distributions)


def _runner(backend: Backend, subject: Subject) -> Callable[[], float]:
    runtime = None if subject.name == DEFAULT_RUNTIME else subject.name
    request = RunRequest(code=subject.code, runtime=runtime)

    def run() -> float:
        t0 = time.perf_counter()
        result = backend.run(request, run_id=uuid.uuid4().hex, collect=lambda _ws: ((), ()))
        elapsed = (time.perf_counter() - t0) * 1000
        if result.outcome.value != "ok":
            raise RuntimeError(
                f"{subject.name}: {result.outcome}: {result.reason} {result.stderr[-500:]!r}"
            )
        return elapsed

    return run


def _wait_ready(backend: Backend, timeout_s: float = 300.0) -> None:
    """A pool measured full, not the refill racing the next run (2 cores)."""
    stats_of = getattr(backend, "warm_stats", None)
    deadline = time.monotonic() + timeout_s
    while stats_of is not None and time.monotonic() < deadline:
        stats = stats_of()
        pool = getattr(stats, "pool", stats)
        if pool is None or not hasattr(pool, "ready") or pool.ready >= pool.size:
            return
        time.sleep(0.01)


def _check_start(backend: Backend, subject: Subject, mode: str) -> None:
    """The warm backend must really serve the runtime warm: a cold fallback would be measured
    as a warm start."""
    runtime = None if subject.name == DEFAULT_RUNTIME else subject.name
    result = backend.run(
        RunRequest(code=subject.code, runtime=runtime),
        run_id=uuid.uuid4().hex,
        collect=lambda _ws: ((), ()),
    )
    if result.start.mode != mode:
        raise RuntimeError(f"{subject.name}: the {mode} backend started {result.start}")


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="samples per runtime and start")
    ap.add_argument("--warm", choices=("pool", "template"), default="pool")
    ap.add_argument("--backend", choices=("namespaces", "gvisor", "microvm"), default="namespaces")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [n for n in args.runtimes.split(",") if n]
    if DEFAULT_RUNTIME not in names:
        names.insert(0, DEFAULT_RUNTIME)  # the baseline of every ratio

    subjects: dict[str, Subject] = {}
    for name in names:
        try:
            subjects[name] = _subject(name)
        except SandcellError as exc:
            print(f"{name}: not measured: {exc}", file=sys.stderr)

    backends: list[Backend] = []
    runners: dict[tuple[str, str], Callable[[], float]] = {}
    warm_backends: dict[str, Backend] = {}
    try:
        # One cold backend serves every runtime; a warm one is made of one runtime.
        cold = create_backend(args.backend)
        backends.append(cold)
        for name, subject in list(subjects.items()):
            try:
                warm = create_backend(
                    args.backend,
                    warm=WarmConfig(
                        mode=args.warm,
                        runtime=None if name == DEFAULT_RUNTIME else name,
                        preload=("numpy",) if subject.has_numpy else (),
                        pool_size=1,
                    ),
                )
                backends.append(warm)
                # Warm-up (page cache, the runtime's verification, the template or pool
                # started), and a check that the warm backend starts warm: a cold fallback
                # would be measured as a warm start.
                cold_run, warm_run = _runner(cold, subject), _runner(warm, subject)
                cold_run()
                _wait_ready(warm)
                _check_start(warm, subject, args.warm)
                _wait_ready(warm)
            except SandcellError as exc:
                # A runtime this backend cannot serve here (a microVM image not built for it).
                if name == DEFAULT_RUNTIME:
                    raise
                print(f"{name}: not measured: {exc}", file=sys.stderr)
                del subjects[name]
                continue
            warm_backends[name] = warm
            runners[(name, "cold")], runners[(name, "warm")] = cold_run, warm_run

        samples: dict[tuple[str, str], list[float]] = {k: [] for k in runners}
        rng = random.Random(args.seed)
        order = list(runners)
        for _ in range(args.runs):
            rng.shuffle(order)
            for key in order:
                if key[1] == "warm":
                    _wait_ready(warm_backends[key[0]])
                samples[key].append(runners[key]())
    finally:
        for b in backends:
            b.close()

    median = {k: statistics.median(v) for k, v in samples.items()}
    base = subjects[DEFAULT_RUNTIME]
    print(
        f"backend {args.backend}, warm start: {args.warm}, median of {args.runs} runs; "
        "ratios against default"
    )
    header = (
        f"{'runtime':12} {'program':12} {'size MiB':>9} {'files':>7} {'size':>7} "
        f"{'cold ms':>8} {'cold':>7} {'warm ms':>8} {'warm':>7} {'warm/cold':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, s in subjects.items():
        cold_ms, warm_ms = median[(name, "cold")], median[(name, "warm")]
        print(
            f"{name:12} {s.code:12} {s.size_bytes / MiB:9.1f} {s.files:7d} "
            f"{_fmt_ratio(ratio(s.size_bytes, base.size_bytes)):>7} "
            f"{cold_ms:8.1f} {_fmt_ratio(ratio(cold_ms, median[(DEFAULT_RUNTIME, 'cold')])):>7} "
            f"{warm_ms:8.1f} {_fmt_ratio(ratio(warm_ms, median[(DEFAULT_RUNTIME, 'warm')])):>7} "
            f"{_fmt_ratio(ratio(warm_ms, cold_ms)):>9}"
        )


if __name__ == "__main__":
    main()
