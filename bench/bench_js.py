"""JavaScript and TypeScript against Python on the same rung, in one run: issue 27's two targets.

    .venv/bin/python bench/bench_js.py [--runs N] [--cells N] [--pool-size N]
        [--ns-preload MOD,...] [--session-rungs namespaces,gvisor,microvm] [--json]

Measures, each JavaScript figure next to a Python baseline taken in the same run, alternated run
by run so that load from other work hits both alike (medians; the ratio is JS over Python):

* ``cold``: ``Executor.run`` end to end on the namespaces rung, a fresh sandbox each time:
  Python ``print(1)``, JavaScript ``console.log(1)``, TypeScript ``console.log(1 as number)``;
* ``pool``: the same from one namespaces executor with ``WarmConfig(mode="pool")`` (Python: the
  template's pool, with ``--ns-preload``; JavaScript and TypeScript: its pool of waiting Node
  sandboxes, ``backends/namespaces/node_pool.py``), each timed run taken once its pool is full
  again, so that every run is a pooled start (the start modes seen are printed); JavaScript and
  TypeScript each in a phase of their own beside Python (``pool js``, ``pool ts``), as the Node
  pool prepares its next sandboxes for the last run's language. Target 1: the pooled
  ``console.log(1)`` within 2x the pooled ``print(1)``;
* ``cell``: a session cell's round trip, the cell ``1`` (its value shown), in a Python session
  and in a JavaScript session on each rung of ``--session-rungs``, two ways: the backend's
  session sandbox (``session_sandbox(...).run_cell``, the kernel's channel and nothing else) and
  the public API (``Executor.session(...).run``: the policy check and the run record as well).
  Target 2: the JavaScript cell within 2x the Python cell. A rung or a way that cannot open a
  JavaScript session is printed as ``not available: <error>`` and the others go on.

The profile is ``unchecked`` (the sandbox is what is measured, not the static checks). Records go
to a temporary ``SANDCELL_HOME``, removed at the end.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
_HOME = tempfile.mkdtemp(prefix="sandcell-bench-js-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _machine import machine_info  # noqa: E402

from sandcell import Executor, Outcome, RunRequest, WarmConfig  # noqa: E402

PROFILE = "unchecked"
PROGRAMS: dict[str, RunRequest] = {
    "python": RunRequest(code="print(1)"),
    "javascript": RunRequest(code="console.log(1)", language="javascript"),
    "typescript": RunRequest(code="console.log(1 as number)", language="typescript"),
}
SESSION_RUNGS = ("namespaces", "gvisor", "microvm")
NODE_CHECK = "console.log(typeof process)"
"""A cell whose output says that the session's kernel is Node (Python has no ``console``)."""

Sample = tuple[list[float], Counter[str]]


@dataclass(frozen=True, slots=True)
class Row:
    section: str
    variant: str
    n: int
    median_ms: float | None
    min_ms: float | None
    modes: str
    note: str = ""


def _row(section: str, name: str, sample: Sample, note: str = "") -> Row:
    xs, modes = sample
    seen = ", ".join(f"{m} {n}" for m, n in modes.most_common())
    return Row(section, name, len(xs), statistics.median(xs), min(xs), seen, note)


def _missing(section: str, name: str, why: str) -> Row:
    return Row(section, name, 0, None, None, "", f"not available: {why}")


def alternate(runners: dict[str, Callable[[], tuple[float, str]]], runs: int) -> dict[str, Sample]:
    """Every runner once per round, ``runs`` rounds, after one untimed warm-up run each."""
    for run in runners.values():
        run()
    out: dict[str, Sample] = {k: ([], Counter()) for k in runners}
    for _ in range(runs):
        for name, run in runners.items():
            ms, mode = run()
            out[name][0].append(ms)
            out[name][1][mode] += 1
    return out


# -- runs --------------------------------------------------------------------------------------


def _timed(ex: Executor, language: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = ex.run(PROGRAMS[language])
    ms = (time.perf_counter() - t0) * 1000
    if r.outcome is not Outcome.OK or r.stdout != "1\n":
        raise RuntimeError(f"{language} gave {r.outcome.value} ({r.reason}): {r.stderr[-400:]}")
    return ms, r.start.mode


def _pools_full(ex: Executor, language: str, timeout_s: float = 120.0) -> None:
    """Wait until the pool that serves ``language`` is full (the Node pool for JS and TS)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = ex.backend.warm_stats()
        pool = getattr(stats, "pool" if language == "python" else "node_pool", None)
        if pool is not None and pool.size and pool.ready >= pool.size:
            return
        time.sleep(0.02)
    raise RuntimeError(f"the {language} pool did not fill in {timeout_s:g} s: {stats}")


def bench_runs(runs: int, size: int, preload: tuple[str, ...]) -> list[Row]:
    cold_ex = Executor(backend="namespaces", profile=PROFILE)

    def cold_run(lang: str) -> Callable[[], tuple[float, str]]:
        return lambda: _timed(cold_ex, lang)

    try:
        cold = alternate({lang: cold_run(lang) for lang in PROGRAMS}, runs)
    finally:
        cold_ex.close()
    rows = [_row("cold", lang, sample) for lang, sample in cold.items()]
    warm = WarmConfig(mode="pool", pool_size=size, preload=preload)
    pool_ex = Executor(backend="namespaces", profile=PROFILE, warm=warm)
    try:

        def pooled(lang: str) -> Callable[[], tuple[float, str]]:
            def run() -> tuple[float, str]:
                _pools_full(pool_ex, lang)
                return _timed(pool_ex, lang)

            return run

        label = f"preload {'+'.join(preload) or 'none'}, {size} waiting"
        # One language at a time beside Python: the Node pool's next sandboxes are made for the
        # last run's language (TypeScript's load the type stripper ahead), so alternating
        # JavaScript and TypeScript would measure neither as its own users see it.
        for other in ("javascript", "typescript"):
            _timed(pool_ex, other)  # the first may start cold: the pool then fills for it
            for _ in range(size):  # what waits was made for the language before
                pooled(other)()
            sample = alternate({"python": pooled("python"), other: pooled(other)}, runs)
            rows += [
                _row(f"pool {'js' if other == 'javascript' else 'ts'}", lang, s, label)
                for lang, s in sample.items()
            ]
        rows.append(_idle(pool_ex))
    finally:
        pool_ex.close()
    return rows


def _idle(ex: Executor) -> Row:
    """The Node pool's idle memory: PSS of each ready sandbox's init and Node, over the ready."""
    _pools_full(ex, "typescript")
    node: Any = getattr(ex.backend.warm_stats(), "node_pool", None)
    per = node.idle_memory_bytes / max(node.ready, 1) / 2**20
    note = f"{per:.1f} MiB PSS per ready Node sandbox (its init and Node; TypeScript-ready)"
    return Row("idle", "node pool", node.ready, None, None, "", note)


# -- session cells -----------------------------------------------------------------------------


def _backend_cell(ex: Executor, language: str) -> tuple[Callable[[], tuple[float, str]], Any]:
    """A timed ``1`` cell in a session sandbox of ``ex``'s backend, and the sandbox."""
    request = RunRequest(code="", language=language)  # type: ignore[arg-type]
    sandbox = ex.backend.session_sandbox(request, session_id=f"benchjs-{uuid.uuid4().hex[:10]}")
    sandbox.start()
    if language != "python":  # a Node kernel indeed
        cell = sandbox.run_cell(NODE_CHECK, timeout_s=30, hard_deadline=None)
        if cell.stdout != b"object\n":
            _close(sandbox)
            raise RuntimeError(f"not a Node kernel: {cell.stdout!r} {cell.stderr[-300:]!r}")

    def run() -> tuple[float, str]:
        t0 = time.perf_counter()
        cell = sandbox.run_cell("1", timeout_s=30, hard_deadline=None)
        ms = (time.perf_counter() - t0) * 1000
        if cell.outcome is not Outcome.OK:
            raise RuntimeError(f"{language} cell: {cell.outcome.value} ({cell.reason})")
        return ms, "cell"

    return run, sandbox


def _api_session(ex: Executor, language: str) -> Any:
    """``Executor.session`` for ``language``: by its ``language=`` where it takes one."""
    if language == "python":
        return ex.session(profile=PROFILE)
    if "language" in inspect.signature(ex.session).parameters:
        chosen: dict[str, Any] = {"language": language}
        return ex.session(profile=PROFILE, **chosen)
    return ex.session(profile=PROFILE)


def _api_cell(ex: Executor, language: str) -> tuple[Callable[[], tuple[float, str]], Any]:
    session = _api_session(ex, language)
    if language != "python":  # a Node kernel indeed
        r = session.run(NODE_CHECK, language=language)
        if r.stdout != "object\n":
            _close(session)
            raise RuntimeError(
                f"not a Node kernel: {r.outcome.value} {r.stdout!r} {r.stderr[-300:]}"
            )

    def run() -> tuple[float, str]:
        t0 = time.perf_counter()
        r = session.run("1", language=language)
        ms = (time.perf_counter() - t0) * 1000
        if r.outcome is not Outcome.OK:
            raise RuntimeError(f"{language} cell: {r.outcome.value} ({r.reason}) {r.stderr[-300:]}")
        return ms, "session"

    return run, session


def _close(thing: Any) -> None:
    for name in ("teardown", "close"):
        if hasattr(thing, name):
            getattr(thing, name)()
            return


def bench_cells(cells: int, rungs: tuple[str, ...]) -> list[Row]:
    rows: list[Row] = []
    for rung in rungs:
        try:
            ex = Executor(backend=rung, profile=PROFILE)
        except Exception as exc:
            for way in ("backend", "api"):
                for lang in ("python", "javascript"):
                    rows.append(_missing(f"cell {way}", f"{rung} {lang}", f"{exc}"))
            continue
        try:
            for way, opener in (("backend", _backend_cell), ("api", _api_cell)):
                opened: dict[str, Any] = {}
                runners: dict[str, Callable[[], tuple[float, str]]] = {}
                for lang in ("python", "javascript"):
                    try:
                        runner, thing = opener(ex, lang)
                        opened[lang] = thing
                        runner()  # the first cell may load what later ones reuse
                        runners[lang] = runner
                    except Exception as exc:
                        rows.append(
                            _missing(
                                f"cell {way}", f"{rung} {lang}", f"{type(exc).__name__}: {exc}"
                            )
                        )
                try:
                    sample = alternate(runners, cells) if runners else {}
                finally:
                    for thing in opened.values():
                        _close(thing)
                rows += [_row(f"cell {way}", f"{rung} {lang}", s) for lang, s in sample.items()]
        finally:
            ex.close()
    return rows


# -- report ------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def ratios(rows: list[Row]) -> list[tuple[str, float]]:
    """JS (and TS) over Python, per section and rung, where both were measured."""
    by = {(r.section, r.variant): r.median_ms for r in rows}
    out = []
    for (section, variant), ms in by.items():
        base = variant.replace("javascript", "python").replace("typescript", "python")
        py = by.get((section, base))
        if base != variant and ms and py:
            out.append((f"{section} {variant} / {base}", ms / py))
    return out


def report(body: dict[str, Any]) -> None:
    info = body["machine"]
    print(f"# JavaScript and TypeScript against Python, profile {PROFILE}")
    print("# " + "  ".join(f"{k}: {v}" for k, v in info.items()))
    print(f"# command: {body['command']}")
    rows = [Row(**r) for r in body["rows"]]
    print(f"\n{'section':<12} {'variant':<24} {'n':>3} {'median ms':>10} {'min ms':>8}  starts")
    for r in rows:
        extra = f"  {r.note}" if r.note else ""
        print(
            f"{r.section:<12} {r.variant:<24} {r.n:>3} {_fmt(r.median_ms):>10} "
            f"{_fmt(r.min_ms):>8}  {r.modes}{extra}"
        )
    print()
    for name, ratio in ratios(rows):
        print(f"ratio {name} (medians): {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed runs per variant, cold and pool")
    ap.add_argument("--cells", type=int, default=30, help="timed cells per session")
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument(
        "--ns-preload",
        default="numpy,pandas",
        help="modules the namespaces template imports (WarmConfig's default; '' for none)",
    )
    ap.add_argument(
        "--session-rungs",
        default="namespaces",
        help=f"rungs whose sessions are measured, comma-separated ({','.join(SESSION_RUNGS)})",
    )
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--skip-cells", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    preload = tuple(m for m in args.ns_preload.split(",") if m)
    rungs = tuple(args.session_rungs.split(","))
    if bad := [r for r in rungs if r not in SESSION_RUNGS]:
        ap.error(f"--session-rungs: unknown {', '.join(bad)}; choose from {SESSION_RUNGS}")
    body: dict[str, Any] = {"machine": machine_info(), "command": " ".join(sys.argv), "rows": []}
    try:
        if not args.skip_runs:
            body["rows"] += [asdict(r) for r in bench_runs(args.runs, args.pool_size, preload)]
        if not args.skip_cells:
            body["rows"] += [asdict(r) for r in bench_cells(args.cells, rungs)]
    except Exception:
        traceback.print_exc()
        raise
    finally:
        shutil.rmtree(_HOME, ignore_errors=True)
    body["machine"]["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    body["ratios"] = dict(ratios([Row(**r) for r in body["rows"]]))
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        report(body)


if __name__ == "__main__":
    main()
