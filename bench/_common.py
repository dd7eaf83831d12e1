"""Shared by the benchmarks: the bare baselines and the timing loops.

The baselines run the interpreter sandcell uses (``python_runtime().interpreter``) with the
environment sandcell gives a program, so the only difference to a sandcell run is the sandbox:

``python_argv``
    the bare interpreter, ``python -I -c CODE``;
``bwrap_argv``
    bare bubblewrap (the binary sandcell uses) around it, with a comparable minimal sandbox: every
    namespace, the runtime's directories read-only, its root symlinks, ``/proc``, ``/dev`` and a
    tmpfs ``/tmp``; no seccomp, cgroup, Landlock, limits, workspace or record.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from sandcell.backends.host.bubblewrap import find_bwrap
from sandcell.runtimes import common_env, python_runtime

__all__ = [
    "Runner",
    "baseline_env",
    "bwrap_argv",
    "interleaved_latency",
    "python_argv",
    "run_pool",
    "subprocess_runner",
    "timed_pool",
]

Runner = Callable[[], None]
"""One run of a program; raises when it did not produce what it should."""


def baseline_env() -> dict[str, str]:
    """The environment sandcell gives a program, given to the baselines too (no host values)."""
    return {**common_env(), **python_runtime().env}


def python_argv(code: str) -> list[str]:
    return [python_runtime().interpreter, "-I", "-c", code]


def bwrap_argv(code: str) -> list[str]:
    rt = python_runtime()
    a = [find_bwrap().path, "--unshare-all", "--unshare-user", "--die-with-parent"]
    for d in rt.ro_dirs:
        a += ["--ro-bind", d, d]
    for link, target in rt.symlinks:
        a += ["--symlink", target, link]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    return [*a, "--", *python_argv(code)]


def subprocess_runner(argv: Sequence[str], *, expect: str | None = None) -> Runner:
    """Runs ``argv`` to completion; fails on a non-zero exit or when ``expect`` is not printed."""
    import subprocess

    env = baseline_env()

    def run() -> None:
        p = subprocess.run(argv, capture_output=True, env=env, check=False)
        if p.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} exited with {p.returncode}: {p.stderr.decode(errors='replace')[-500:]}"
            )
        if expect is not None and expect not in p.stdout.decode(errors="replace"):
            raise RuntimeError(f"{argv[0]} did not print {expect!r}: {p.stdout[-200:]!r}")

    return run


def _time_ms(run: Runner) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1000


def interleaved_latency(
    runners: Mapping[str, Runner],
    *,
    rounds: int,
    budget_s: float,
    rng: random.Random,
    min_samples: int = 3,
) -> dict[str, list[float] | BaseException]:
    """Latency samples (ms) per runner, the runners in a fresh shuffled order every round.

    Interleaving spreads a noisy machine's drift over every runner alike. A runner whose samples
    add up to ``budget_s`` stops early once it has ``min_samples``; one that fails is dropped with
    its exception as the result.
    """
    out: dict[str, list[float] | BaseException] = {k: [] for k in runners}
    spent = dict.fromkeys(runners, 0.0)
    order = list(runners)
    for _ in range(rounds):
        rng.shuffle(order)
        active = 0
        for key in order:
            samples = out[key]
            if not isinstance(samples, list):
                continue
            if spent[key] >= budget_s and len(samples) >= min_samples:
                continue
            active += 1
            try:
                ms = _time_ms(runners[key])
            except Exception as exc:
                out[key] = exc
                continue
            samples.append(ms)
            spent[key] += ms / 1000
        if not active:
            break
    return out


def run_pool(run: Runner, total: int, workers: int) -> float:
    """Seconds for ``total`` runs by ``workers`` threads sharing one counter."""
    lock = threading.Lock()
    left = [total]
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0 or errors:
                    return
                left[0] -= 1
            try:
                run()
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def timed_pool(
    run: Runner, *, workers: int, seconds: float, min_runs: int = 1
) -> tuple[int, float]:
    """``workers`` threads run back to back until ``seconds`` have passed and ``min_runs`` are done.

    Returns (completed runs, seconds until the last one finished): a run started before the
    deadline is waited for and counted, so slow variants are not cut off mid-run.
    """
    lock = threading.Lock()
    done = [0]
    started = [0]
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    deadline = t0 + seconds

    def worker() -> None:
        while True:
            with lock:
                if errors or (time.perf_counter() >= deadline and started[0] >= min_runs):
                    return
                started[0] += 1
            try:
                run()
            except BaseException as exc:
                errors.append(exc)
                return
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return done[0], elapsed
