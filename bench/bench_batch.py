"""Benchmark: ``sandcell batch`` on the 164 HumanEval problems against plain ``python3`` processes.

Usage::

    .venv/bin/python bench/bench_batch.py [--concurrency 1 2] [--starts cold template pool]
        [--preload MOD,...] [--profile unchecked] [--workload humaneval|pandas] [--json]

``--workload pandas`` runs 40 data tasks instead: each imports pandas, reads the same CSV
(20,000 rows, an input of every task, read from the working directory) and prints a group-by
aggregate; the baseline runs each as ``python -I -c`` in the CSV's directory. Run it with
``--preload pandas``: the ratio that counts is over the whole command (the ``wall s`` column, the
pool's start included), shown as ``vs py3 (wall)``.

Both sides run the same programs: each problem's prompt and canonical solution, then its test and
``check(ENTRY_POINT)`` (``examples/humaneval/make_tasks.py``), under the batch judge's harness
(the test in a process of its own), with the same interpreter
(``sandcell.runtimes.python_runtime().interpreter``). The baseline starts one
``python -I -c PROGRAM`` process per task from a thread pool of the same size, and counts a task
passed when it exits 0. sandcell runs ``sandcell batch TASKS --concurrency N --start MODE
--restart --json`` as a subprocess, once per start mode: each task in a fresh sandbox
(namespaces, cgroups, seccomp, Landlock), checked by the policy profile and written to the audit
log. ``cold`` builds each sandbox from scratch; ``template`` forks each from a template
interpreter that imported ``--preload`` (default: nothing, as HumanEval needs only the stdlib) and
never ran task code; ``pool`` takes one of concurrency + 1 such sandboxes forked ahead. The
``warm`` column counts the tasks a warm start actually served (the rest started cold). Tasks per
second are over the run phase (the summary's ``elapsed_s``, which starts once the executor, and
so the template, is up); the wall time of the whole command, start-up included, is shown too.

The profile defaults to ``unchecked`` so that every program runs: the default ``strict`` profile
denies HumanEval/160, which calls ``eval`` on a built string. Records and run directories go to a
temporary ``SANDCELL_HOME``/``SANDCELL_RUNS``, removed at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_HOME = tempfile.mkdtemp(prefix="sandcell-bench-batch-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from sandcell.batch import load_tasks, program_for, stdin_for  # noqa: E402
from sandcell.batch.judge import new_secret  # noqa: E402
from sandcell.policy.profiles import load_profile  # noqa: E402
from sandcell.runtimes import python_runtime  # noqa: E402


def machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    variant: str
    concurrency: int
    tasks: int
    passed: int
    warm: int
    """Tasks a template or pool start served."""
    elapsed_s: float
    """The run phase: the thread pool's time, or the batch summary's ``elapsed_s``."""
    wall_s: float
    """The whole command, start-up included."""

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.elapsed_s


_PANDAS_TASKS = 40
_PANDAS_CODE = (
    "import pandas as pd\n"
    "df = pd.read_csv('data.csv')\n"
    "out = df.groupby('region').agg(total=('amount', 'sum'), n=('amount', 'size'))\n"
    "print(out.sort_values('total').to_string())\n"
)


def write_pandas_tasks(folder: Path) -> Path:
    """40 pandas tasks over one CSV in ``folder``; returns the tasks file."""
    regions = ("north", "south", "east", "west", "centre")
    rows = [f"{i},{regions[i % 5]},{(i * 7919) % 1000 / 10:.1f}" for i in range(20_000)]
    (folder / "data.csv").write_text("id,region,amount\n" + "\n".join(rows) + "\n")
    lines = [
        json.dumps({"id": f"pandas-{i}", "code": _PANDAS_CODE, "inputs": ["data.csv"]})
        for i in range(_PANDAS_TASKS)
    ]
    tasks = folder / "pandas.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    return tasks


def bench_python(
    programs: list[tuple[str, bytes]], concurrency: int, cwd: Path | None = None
) -> Row:
    python = python_runtime().interpreter

    def one(program: tuple[str, bytes]) -> bool:
        code, stdin = program
        p = subprocess.run(
            [python, "-I", "-c", code], input=stdin, capture_output=True, check=False, cwd=cwd
        )
        return p.returncode == 0

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        passed = sum(pool.map(one, programs))
    elapsed = time.monotonic() - t0
    return Row(
        variant="python3",
        concurrency=concurrency,
        tasks=len(programs),
        passed=passed,
        warm=0,
        elapsed_s=elapsed,
        wall_s=elapsed,
    )


def bench_sandcell(tasks: Path, concurrency: int, profile: str, start: str, preload: str) -> Row:
    argv = [sys.executable, "-m", "sandcell", "batch", str(tasks), "-j", str(concurrency)]
    argv += ["--restart", "--json", "--profile", profile, "--start", start]
    if start != "cold" and preload:
        argv += ["--preload", preload]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"sandcell batch failed (exit {p.returncode}): {p.stderr}")
    s = json.loads(p.stdout)
    starts = s["starts"]
    return Row(
        variant=f"sandcell {start}",
        concurrency=concurrency,
        tasks=int(s["ran"]),
        passed=int(s["passed"]),
        warm=int(starts.get("template", 0)) + int(starts.get("pool", 0)),
        elapsed_s=float(s["elapsed_s"]),
        wall_s=wall,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--starts",
        nargs="+",
        choices=("cold", "template", "pool"),
        default=["cold", "template", "pool"],
    )
    ap.add_argument("--preload", default="", help="modules the template imports (default: none)")
    ap.add_argument("--profile", default="unchecked")
    ap.add_argument("--workload", choices=("humaneval", "pandas"), default="humaneval")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    try:
        cwd: Path | None = None
        if args.workload == "pandas":
            cwd = Path(_HOME) / "pandas"
            cwd.mkdir()
            tasks_file = write_pandas_tasks(cwd)
        else:
            make = runpy.run_path(str(REPO / "examples" / "humaneval" / "make_tasks.py"))
            tasks_file = Path(_HOME) / "humaneval.jsonl"
            make["write"](tasks_file)
        tasks = load_tasks(tasks_file, load_profile(args.profile))
        # The baseline runs exactly what the sandbox runs: the judge's harness, which runs the
        # test in a process of its own, and its secret on standard input.
        programs = [(program_for(t), stdin_for(t, new_secret())) for t in tasks]
        info = machine()
        rows: list[Row] = []
        for n in args.concurrency:
            rows.append(bench_python(programs, n, cwd))
            rows.extend(
                bench_sandcell(tasks_file, n, args.profile, start, args.preload)
                for start in args.starts
            )
    finally:
        shutil.rmtree(_HOME, ignore_errors=True)
    base = {r.concurrency: r.tasks_per_s for r in rows if r.variant == "python3"}
    base_wall = {r.concurrency: r.wall_s for r in rows if r.variant == "python3"}
    ratios = {
        f"{r.variant} j{r.concurrency}": r.tasks_per_s / base[r.concurrency]
        for r in rows
        if r.variant != "python3"
    }
    wall_ratios = {
        f"{r.variant} j{r.concurrency}": base_wall[r.concurrency] / r.wall_s
        for r in rows
        if r.variant != "python3"
    }
    if args.json:
        body = {
            "machine": info,
            "profile": args.profile,
            "preload": args.preload,
            "rows": [{**asdict(r), "tasks_per_s": r.tasks_per_s} for r in rows],
            "workload": args.workload,
            "ratio_sandcell_to_python": ratios,
            "ratio_sandcell_to_python_wall": wall_ratios,
        }
        print(json.dumps(body, indent=2))
        return
    load = info["loadavg_at_start"]
    what = "HumanEval problems" if args.workload == "humaneval" else "pandas tasks"
    print(f"# sandcell batch vs plain python3: {len(programs)} {what}")
    print(
        f"# {info['date']}  {info['cpu']} x{info['cpus']}  kernel {info['kernel']}  "
        f"load {load}  profile {args.profile}  preload {args.preload or 'none'}"
    )
    head = f"{'variant':<18} {'conc':>4} {'tasks/s':>8} {'vs py3':>7} {'passed':>7} {'warm':>5}"
    print(f"{head} {'run s':>7} {'wall s':>7} {'vs py3 (wall)':>13}")
    for r in rows:
        ratio = r.tasks_per_s / base[r.concurrency]
        wall_ratio = base_wall[r.concurrency] / r.wall_s
        print(
            f"{r.variant:<18} {r.concurrency:>4} {r.tasks_per_s:>8.1f} {ratio:>6.2f}x "
            f"{r.passed:>7} {r.warm:>5} {r.elapsed_s:>7.2f} {r.wall_s:>7.2f} {wall_ratio:>12.2f}x"
        )


if __name__ == "__main__":
    main()
