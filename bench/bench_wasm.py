"""The wasm rung against the namespaces rung, in one run: start latency, idle memory, HumanEval.

    .venv/bin/python bench/bench_wasm.py [--runs N] [--pool-size N] [--ns-preload MOD,...]
        [--concurrency N] [--memory-rungs all|RUNG,...] [--skip-latency] [--skip-memory]
        [--skip-humaneval] [--json]

Measures, each wasm figure next to a namespaces baseline taken in the same run:

* ``cold``: ``Executor.run`` of ``print(1)`` end to end, a fresh sandbox each time, wasm
  (Pyodide restored from its memory snapshot under Node.js, inside a namespaces sandbox) and
  namespaces (CPython), alternated run by run so that load from other work hits both alike;
* ``pool``: the same from a warm pool (wasm: ``WarmConfig(mode="pool", pool_size=N)``;
  namespaces: ``WarmConfig(mode="pool")`` with ``--ns-preload``), each timed run taken once the
  pool is full again, so that every run is a pooled start (the start modes seen are printed);
  a wasm pool that cannot be opened is reported as ``pool: not available: <error>``;
* idle memory, for every rung in ``--memory-rungs`` (namespaces with the ``--ns-preload``
  template and without one, wasm, gVisor, microVM), one full pool of ``--pool-size`` at a time:
  the PSS (``/proc/PID/smaps_rollup``) of every process the quiet pool keeps below this process
  (``bench/bench_density.py``'s figure), over the sandboxes ready. gVisor adds the processes in
  its waiting sandboxes' cgroups (should they not be below this process) and notes the cgroups'
  own charge (``SandboxPoolStats.idle_memory_bytes``, not PSS); microVM notes one QEMU's PSS by
  source (``bench_microvm.idle_pss_parts``). A rung whose pool cannot be opened or filled is
  printed as ``not available: <reason>`` and the others go on. The cold runs'
  ``usage.peak_memory_bytes`` (wasm, namespaces) are printed too, said so;
* HumanEval (``--humaneval-start cold|pool``): the 164 canonical solutions and their broken
  twins (the body ``return None``, as ``examples/humaneval/make_tasks.py --wrong``), each the
  prompt, the solution, the test and ``check(ENTRY_POINT)`` as one program (as in
  ``tests/integration/test_humaneval.py``), run on wasm (``--concurrency`` threads sharing one
  Executor) and under plain ``python -I -c`` (the runtime's interpreter, same thread count). A
  task matches when both give the same verdict (exit 0 or not) and, when both fail, the same
  exception class (the traceback's last line); each mismatch is printed with both stderr tails.

The profile is ``unchecked`` (HumanEval/160 calls ``eval`` on a built string, which ``strict``
denies). Records go to a temporary ``SANDCELL_HOME``, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
_HOME = tempfile.mkdtemp(prefix="sandcell-bench-wasm-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _machine import descendants, machine_info  # noqa: E402
from _memory import _total_pss, settle  # noqa: E402

from sandcell import Executor, Limits, Outcome, RunRequest, RunResult, WarmConfig  # noqa: E402
from sandcell.runtimes import python_runtime  # noqa: E402

MIB = 1024 * 1024
PROFILE = "unchecked"
PRINT = RunRequest(code="print(1)")
HE_LIMITS = Limits(wall_time_s=10)
RUNGS = ("namespaces", "wasm", "gvisor", "microvm")
_EXC = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning))\b")


@dataclass(frozen=True, slots=True)
class LatencyRow:
    variant: str
    n: int
    median_ms: float | None
    min_ms: float | None
    modes: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class MemoryRow:
    variant: str
    ready: int
    processes: int
    total_mib: float | None
    per_ready_mib: float | None
    note: str


def _ready(ex: Executor) -> int | None:
    """Sandboxes waiting now: the namespaces pool reports under ``.pool``, sandbox pools (wasm,
    gVisor) at the top level; None when the backend has no pool."""
    st = getattr(ex.backend, "warm_stats", lambda: None)()
    pool = getattr(st, "pool", None) or st
    ready = getattr(pool, "ready", None)
    return ready if isinstance(ready, int) else None


def _wait_pool_full(ex: Executor, size: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = _ready(ex)
        if ready is None:
            return False
        if ready >= size:
            return True
        time.sleep(0.05)
    return False


# -- latency ---------------------------------------------------------------------------------


def _timed(ex: Executor) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = ex.run(PRINT)
    ms = (time.perf_counter() - t0) * 1000
    if r.outcome is not Outcome.OK or r.stdout != "1\n":
        raise RuntimeError(f"print(1) gave {r.outcome.value} ({r.reason}): {r.stderr[-400:]}")
    return ms, r.start.mode


def alternate(
    runners: dict[str, Callable[[], tuple[float, str]]], runs: int
) -> dict[str, tuple[list[float], Counter[str]]]:
    """Every runner once per round, ``runs`` rounds, after one untimed warm-up run each."""
    for run in runners.values():
        run()
    out: dict[str, tuple[list[float], Counter[str]]] = {k: ([], Counter()) for k in runners}
    for _ in range(runs):
        for name, run in runners.items():
            ms, mode = run()
            out[name][0].append(ms)
            out[name][1][mode] += 1
    return out


def _row(name: str, sample: tuple[list[float], Counter[str]], note: str = "") -> LatencyRow:
    xs, modes = sample
    seen = ", ".join(f"{m} {n}" for m, n in modes.most_common())
    return LatencyRow(name, len(xs), statistics.median(xs), min(xs), seen, note)


def _pooled(ex: Executor, size: int) -> Callable[[], tuple[float, str]]:
    """A timed run that waits for the pool to be full first, so each run is a pooled start."""

    def run() -> tuple[float, str]:
        _wait_pool_full(ex, size)
        return _timed(ex)

    return run


FILL_TIMEOUT_S = {"microvm": 300.0}
"""How long a pool may take to fill before it is reported unavailable (a microVM restores a
snapshot under TCG: seconds each); 120 s for the rest."""


def _open_pool(
    backend: str, size: int, preload: tuple[str, ...] | None = None
) -> tuple[Executor | None, str]:
    """A full pool of ``size`` sandboxes on ``backend``, or (None, why not)."""
    warm = (
        WarmConfig(mode="pool", pool_size=size)
        if preload is None
        else WarmConfig(mode="pool", pool_size=size, preload=preload)
    )
    try:
        ex = Executor(backend=backend, profile=PROFILE, warm=warm)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    timeout = FILL_TIMEOUT_S.get(backend, 120.0)
    if not _wait_pool_full(ex, size, timeout_s=timeout):
        st = getattr(ex.backend, "warm_stats", lambda: None)()
        ex.close()
        return None, f"the pool did not fill to {size} in {timeout:g} s (stats: {st})"
    return ex, ""


def _open_wasm_pool(size: int) -> tuple[Executor | None, str]:
    return _open_pool("wasm", size)


def _open_ns_pool(size: int, preload: tuple[str, ...]) -> Executor:
    ex, why = _open_pool("namespaces", size, preload)
    if ex is None:
        raise SystemExit(f"the namespaces pool: {why}")
    return ex


def bench_latency(runs: int, size: int, preload: tuple[str, ...]) -> list[LatencyRow]:
    wasm = Executor(backend="wasm", profile=PROFILE)
    ns = Executor(backend="namespaces", profile=PROFILE)
    try:
        cold = alternate(
            {"wasm cold": lambda: _timed(wasm), "namespaces cold": lambda: _timed(ns)}, runs
        )
    finally:
        wasm.close()
        ns.close()
    rows = [_row(k, v) for k, v in cold.items()]
    label = f"namespaces pool ({'+'.join(preload) or 'no'} preload)"
    wpool, why = _open_wasm_pool(size)
    nspool = _open_ns_pool(size, preload)
    try:
        runners = {label: _pooled(nspool, size)}
        if wpool is not None:
            runners["wasm pool"] = _pooled(wpool, size)
        try:
            pooled = alternate(runners, runs)
        except Exception as exc:
            if wpool is None:
                raise
            why = f"{type(exc).__name__}: {exc}"
            wpool.close()
            wpool = None
            pooled = alternate({label: _pooled(nspool, size)}, runs)
    finally:
        nspool.close()
        if wpool is not None:
            wpool.close()
    rows += [_row(k, v) for k, v in pooled.items()]
    if "wasm pool" not in pooled:
        rows.append(LatencyRow("wasm pool", 0, None, None, "", f"pool: not available: {why}"))
    return rows


# -- memory ----------------------------------------------------------------------------------


def _gvisor_cgroup_pids(ex: Executor) -> tuple[set[int], int]:
    """The processes in the waiting gVisor sandboxes' cgroups (runsc, its sandbox and gofer),
    and the cgroups' memory charge in bytes (the pool's own ``idle_memory_bytes``)."""
    pool = getattr(ex.backend, "_pool", None)
    pids: set[int] = set()
    for sb in list(getattr(pool, "_ready", ())):
        for d in getattr(getattr(sb, "cgroup", None), "dirs", {}).values():
            try:
                pids.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
    st = ex.backend.warm_stats()
    return pids, int(getattr(st, "idle_memory_bytes", 0) or 0)


def _microvm_parts(ex: Executor) -> str:
    """One ready QEMU's PSS by source (``bench_microvm.idle_pss_parts``), as a note."""
    from bench_microvm import idle_pss_parts  # imports the microVM backend: only when measured

    st = ex.backend.warm_stats()
    parts = idle_pss_parts(getattr(st, "template_state", {}).get("snapshot_dir"))
    return ", ".join(f"{k} {v}" for k, v in parts.items()) if parts else ""


def _pool_pss(
    name: str, backend: str, opener: Callable[[], tuple[Executor | None, str]]
) -> MemoryRow:
    """PSS of every process a full, quiet pool keeps (see module), over the sandboxes ready."""
    before = set(descendants(os.getpid()))
    try:
        ex, why = opener()
    except (Exception, SystemExit) as exc:
        ex, why = None, f"{type(exc).__name__}: {exc}"
    if ex is None:
        return MemoryRow(name, 0, 0, None, None, f"not available: {why}")
    extra = ""
    try:
        pids = set(settle(before))
        if backend == "gvisor":
            # runsc's sandbox and gofer should be below this process; the cgroups say for sure.
            in_cgroups, charge = _gvisor_cgroup_pids(ex)
            outside = in_cgroups - pids
            pids |= in_cgroups
            extra = f"; the cgroups' own charge {charge / MIB:.1f} MiB in all (not PSS)"
            if outside:
                extra += f"; {len(outside)} of them were not below this process"
        elif backend == "microvm":
            parts = _microvm_parts(ex)
            extra = f"; one QEMU's PSS by source (MiB): {parts}" if parts else ""
        total, counted = _total_pss(sorted(pids))
        ready = _ready(ex) or 0
    finally:
        ex.close()
    what = {
        "namespaces": "bwrap, template, waiting children",
        "wasm": "bwrap and Node.js+Pyodide per waiting sandbox",
        "gvisor": "runsc, its sandbox (Sentry) and gofer per waiting sandbox",
        "microvm": "jailer and QEMU per waiting VM",
    }[backend]
    note = f"PSS of every process the pool keeps ({what}) / ready{extra}"
    return MemoryRow(name, ready, counted, total / 1024, total / 1024 / max(ready, 1), note)


def _cold_peak(backend: str, runs: int) -> MemoryRow:
    ex = Executor(backend=backend, profile=PROFILE)
    try:
        peaks = [ex.run(PRINT).usage.peak_memory_bytes or 0 for _ in range(runs)]
    finally:
        ex.close()
    med = statistics.median(peaks) / MIB
    note = "cold print(1): median usage.peak_memory_bytes (the sandbox cgroup's peak), not PSS"
    return MemoryRow(f"{backend} cold peak", 0, 0, None, med, note)


def bench_memory(size: int, preload: tuple[str, ...], rungs: tuple[str, ...]) -> list[MemoryRow]:
    """One pool at a time per rung in ``rungs``, each closed before the next opens."""
    rows: list[MemoryRow] = []
    for rung in rungs:
        if rung == "namespaces":
            for pre in dict.fromkeys((preload, ())):
                label = f"namespaces pool ({'+'.join(pre) or 'no'} preload)"
                rows.append(_pool_pss(label, rung, lambda p=pre: (_open_ns_pool(size, p), "")))
        else:
            rows.append(_pool_pss(f"{rung} pool", rung, lambda r=rung: _open_pool(r, size)))
    # The cold peaks: context, and wasm's figure when its pool is missing.
    for rung in ("wasm", "namespaces"):
        if rung in rungs:
            try:
                rows.append(_cold_peak(rung, 5))
            except Exception as exc:
                rows.append(
                    MemoryRow(f"{rung} cold peak", 0, 0, None, None, f"not available: {exc}")
                )
    return rows


# -- HumanEval -------------------------------------------------------------------------------


def _problems() -> list[dict[str, str]]:
    import runpy

    make = runpy.run_path(
        str(Path(__file__).resolve().parents[1] / "examples/humaneval/make_tasks.py")
    )
    problems: list[dict[str, str]] = make["problems"]()
    return problems


def _program(p: dict[str, str], solution: str) -> str:
    return p["prompt"] + solution + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"


def _exception(stderr: str) -> str:
    """The exception class a traceback ends with ('' when none is found)."""
    for line in reversed(stderr.strip().splitlines()):
        m = _EXC.match(line.strip())
        if m:
            return m.group(1).rsplit(".", 1)[-1]
    return ""


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    exception: str
    detail: str
    stderr_tail: str
    start: str = "process"


def _plain(code: str) -> Verdict:
    python = python_runtime().interpreter
    try:
        p = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return Verdict(False, "timeout", "timeout", "")
    return Verdict(p.returncode == 0, _exception(p.stderr), f"exit {p.returncode}", p.stderr[-600:])


def _sandboxed(ex: Executor, code: str) -> Verdict:
    r: RunResult = ex.run(RunRequest(code=code, limits=HE_LIMITS))
    ok = r.outcome is Outcome.OK
    exc = "timeout" if r.outcome is Outcome.TIMEOUT else _exception(r.stderr)
    detail = f"{r.outcome.value} ({r.reason})"
    return Verdict(ok, exc, detail, r.stderr[-600:], r.start.mode)


def bench_humaneval(concurrency: int, first: int | None, start: str) -> dict[str, Any]:
    problems = _problems()[:first]
    sets = {
        "canonical": {p["task_id"]: _program(p, p["canonical_solution"]) for p in problems},
        "broken": {p["task_id"]: _program(p, "    return None\n") for p in problems},
    }
    warm = WarmConfig(mode="pool", pool_size=concurrency) if start == "pool" else None
    ex = Executor(backend="wasm", profile=PROFILE, warm=warm)
    out: dict[str, Any] = {}
    try:
        for name, programs in sets.items():
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                t0 = time.monotonic()
                plain = dict(zip(programs, pool.map(_plain, programs.values()), strict=True))
                t_plain = time.monotonic() - t0
                t0 = time.monotonic()
                wasm = dict(
                    zip(
                        programs,
                        pool.map(lambda c: _sandboxed(ex, c), programs.values()),
                        strict=True,
                    )
                )
                t_wasm = time.monotonic() - t0
            mismatches = []
            for tid in programs:
                a, b = plain[tid], wasm[tid]
                if a.passed != b.passed or (not a.passed and a.exception != b.exception):
                    mismatches.append({"task": tid, "python": asdict(a), "wasm": asdict(b)})
            out[name] = {
                "start": start,
                "wasm_starts": dict(Counter(v.start for v in wasm.values())),
                "tasks": len(programs),
                "python_passed": sum(v.passed for v in plain.values()),
                "wasm_passed": sum(v.passed for v in wasm.values()),
                "python_s": t_plain,
                "wasm_s": t_wasm,
                "failure_kinds_python": dict(
                    Counter(v.exception for v in plain.values() if not v.passed)
                ),
                "failure_kinds_wasm": dict(
                    Counter(v.exception for v in wasm.values() if not v.passed)
                ),
                "mismatches": mismatches,
            }
    finally:
        ex.close()
    return out


# -- report ----------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def report(body: dict[str, Any]) -> None:
    info = body["machine"]
    print(f"# wasm rung vs the other rungs, profile {PROFILE}")
    print("# " + "  ".join(f"{k}: {v}" for k, v in info.items()))
    if "latency" in body:
        lat = [LatencyRow(**r) for r in body["latency"]]
        by = {r.variant: r for r in lat}
        print(f"\n{'print(1), end to end':<42} {'n':>3} {'median ms':>10} {'min ms':>8}  starts")
        for r in lat:
            extra = f"  {r.note}" if r.note else ""
            print(
                f"{r.variant:<42} {r.n:>3} {_fmt(r.median_ms):>10} {_fmt(r.min_ms):>8}  "
                f"{r.modes}{extra}"
            )
        cw, cn = by["wasm cold"].median_ms, by["namespaces cold"].median_ms
        if cw and cn:
            print(f"ratio wasm cold / namespaces cold (medians): {cw / cn:.2f}x")
        pw = by["wasm pool"].median_ms
        pn = next((r.median_ms for r in lat if r.variant.startswith("namespaces pool")), None)
        if pw and pn:
            print(f"ratio wasm pool / namespaces pool (medians): {pw / pn:.2f}x")
    if "memory" in body:
        print(f"\n{'rung':<36} {'start':<5} {'ready':>5} {'PSS MiB/ready':>13}  what was measured")
        for m in (MemoryRow(**r) for r in body["memory"]):
            rung, _, start = m.variant.rpartition(" pool")
            if not _:
                rung, start = m.variant.removesuffix(" cold peak"), "cold"
            else:
                rung, start = rung + start, "pool"
            print(
                f"{rung:<36} {start:<5} {m.ready:>5} {_fmt(m.per_ready_mib):>13}  "
                f"{m.note}" + (f" [{m.processes} processes]" if m.processes else "")
            )
    for name, he in body.get("humaneval", {}).items():
        print(
            f"\nHumanEval {name}: {he['tasks']} tasks; passed: python {he['python_passed']}, "
            f"wasm {he['wasm_passed']}; {len(he['mismatches'])} verdict mismatches; "
            f"time: python {he['python_s']:.1f} s, wasm {he['wasm_s']:.1f} s "
            f"({he['wasm_s'] / he['python_s']:.1f}x)"
        )
        print(f"  wasm ({he['start']}) runs started as: {he['wasm_starts']}")
        print(f"  failures by exception: python {he['failure_kinds_python']}")
        print(f"                         wasm   {he['failure_kinds_wasm']}")
        for m in he["mismatches"]:
            py, wa = m["python"], m["wasm"]
            print(
                f"  MISMATCH {m['task']}: python {py['detail']} {py['exception'] or '-'}; "
                f"wasm {wa['detail']} {wa['exception'] or '-'}"
            )
            print(
                "    python stderr tail: "
                + (py["stderr_tail"][-300:].replace("\n", "\n      ") or "-")
            )
            print(
                "    wasm stderr tail:   "
                + (wa["stderr_tail"][-300:].replace("\n", "\n      ") or "-")
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed print(1) runs per variant")
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument(
        "--ns-preload",
        default="numpy,pandas",
        help="modules the namespaces template imports (WarmConfig's default; '' for none)",
    )
    ap.add_argument("--concurrency", type=int, default=2, help="HumanEval threads")
    ap.add_argument("--first", type=int, metavar="N", help="HumanEval: only the first N problems")
    ap.add_argument(
        "--humaneval-start",
        choices=("cold", "pool"),
        default="cold",
        help="HumanEval on wasm: a cold sandbox per task, or a pool of --concurrency sandboxes",
    )
    ap.add_argument(
        "--memory-rungs",
        default="all",
        help=f"rungs whose idle pools are measured, comma-separated ({','.join(RUNGS)}; all)",
    )
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-humaneval", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    preload = tuple(m for m in args.ns_preload.split(",") if m)
    rungs = RUNGS if args.memory_rungs == "all" else tuple(args.memory_rungs.split(","))
    if bad := [r for r in rungs if r not in RUNGS]:
        ap.error(f"--memory-rungs: unknown {', '.join(bad)}; choose from {', '.join(RUNGS)}")
    body: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv)}
    try:
        if not args.skip_latency:
            body["latency"] = [asdict(r) for r in bench_latency(args.runs, args.pool_size, preload)]
        if not args.skip_memory:
            body["memory"] = [asdict(r) for r in bench_memory(args.pool_size, preload, rungs)]
        if not args.skip_humaneval:
            body["humaneval"] = bench_humaneval(args.concurrency, args.first, args.humaneval_start)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        shutil.rmtree(_HOME, ignore_errors=True)
    body["machine"]["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        report(body)


if __name__ == "__main__":
    main()
