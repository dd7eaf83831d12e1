"""``sandcell batch``: run every task of a JSON-lines file, each in a fresh sandbox, resumably.

Exit status (see :mod:`sandcell.status`): 0 when every task has a result and passed; 1 when every
task ran but at least one did not pass (a run that ended other than ``ok``, a failed test, a
stdout that differs); 128+N when signal N (SIGINT, SIGTERM) interrupted the batch, which the same
command resumes; 78 for a bad tasks file, with nothing run.

Start mode: ``--start pool`` is the default because it is faster with the same verdicts: on the
164 HumanEval problems on 2 cores, ``bench/bench_batch.py`` measured 34.0 tasks/s from the pool,
28.2 from the template and 16.3 cold at concurrency 1 (plain ``python3``: 44.4), and 38.7, 38.8
and 25.4 at concurrency 2 (``python3``: 68.2), all 164 passing each way. Every task still gets a
fresh sandbox that is destroyed after it; what a warm start shares with the other runs is the
template's pre-fork memory image (see :mod:`sandcell.backends.namespaces.warm`); ``--start cold``
avoids even that. Nothing is preloaded by default: importing numpy and pandas into the template
halved the rate for these stdlib programs (20.4 against 38.8 tasks/s from the pool at
concurrency 1), as every fork copies a larger process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sandcell import status
from sandcell.cli.options import add_backend_option
from sandcell.errors import ConfigError
from sandcell.spec import IsolationMode

if TYPE_CHECKING:
    from sandcell.backends.warm import WarmConfig
    from sandcell.batch import BatchSummary

_PLAIN_EVERY_S = 5.0
_BAR_WIDTH = 30


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "batch",
        help="run many programs from a JSON-lines tasks file, resumably",
        description="Run every task of TASKS (one JSON object a line: id, code, language, "
        "inputs, stdin, expected_stdout, compare, test, limits, exports), each in a fresh "
        "sandbox, writing one result line per task. Rerunning the same command resumes: tasks "
        "with a result line are not run again.",
    )
    b.add_argument("tasks", type=Path, metavar="TASKS.jsonl")
    b.add_argument(
        "--concurrency",
        "-j",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="tasks running at once (default: the number of CPUs)",
    )
    b.add_argument(
        "--results", type=Path, metavar="FILE", help="results file (default: TASKS.results.jsonl)"
    )
    b.add_argument(
        "--profile",
        help="policy profile for every task (default: $SANDCELL_PROFILE, else strict)",
    )
    b.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="wall-time limit of a task that sets none in its limits",
    )
    b.add_argument(
        "--isolation",
        choices=[m.value for m in IsolationMode],
        default=IsolationMode.STRICT.value,
        help="'rlimits' is a weaker mode for hosts without cgroups; it is recorded",
    )
    b.add_argument(
        "--start",
        choices=("cold", "template", "pool"),
        default="pool",
        help="how each python task's sandbox starts: taken from a warm pool of sandboxes forked "
        "ahead from a template (default), forked from the template when the task starts, or "
        "cold; one fresh sandbox per task either way, and each result line says which (a task "
        "the warm path cannot serve, such as bash, starts cold)",
    )
    b.add_argument(
        "--preload",
        default="",
        metavar="MOD,...",
        help="modules the template imports before it forks (default: none; only with "
        "--start template or pool)",
    )
    b.add_argument(
        "--pool-size",
        type=int,
        metavar="N",
        help="sandboxes kept waiting with --start pool (default: concurrency + 1)",
    )
    add_backend_option(b)
    b.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the tasks on a Ray cluster ('auto': the one started on this machine, else "
        "HOST:PORT): one sandcell worker per node offering the sandcell_slots resource, the same "
        "results file and resume rules (needs the ray extra; see docs/ray.md)",
    )
    b.add_argument(
        "--restart", action="store_true", help="discard the results file's lines and run all"
    )
    b.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def warm_config(args: argparse.Namespace) -> WarmConfig | None:
    """The executor's warm-start option from ``--start``, ``--preload`` and ``--pool-size``."""
    from sandcell.backends.warm import WarmConfig

    preload = tuple(m.strip() for m in args.preload.split(",") if m.strip())
    if args.start == "cold":
        if preload or args.pool_size is not None:
            raise ConfigError("--preload and --pool-size need --start template or --start pool")
        return None
    if args.pool_size is not None and args.start != "pool":
        raise ConfigError("--pool-size needs --start pool")
    # One waiting sandbox per worker plus one: a worker that finishes finds the next one ready
    # while the refill of the one it took is still under way.
    size = args.pool_size if args.pool_size is not None else args.concurrency + 1
    return WarmConfig(mode=args.start, preload=preload, pool_size=size)


def results_path_for(tasks: Path) -> Path:
    """``tasks.jsonl`` → ``tasks.results.jsonl``, next to it."""
    stem = tasks.name.removesuffix(".jsonl")
    return tasks.with_name(f"{stem}.results.jsonl")


class _Progress:
    """A textual bar redrawn with ``\\r`` on a terminal, else a plain line every few seconds."""

    def __init__(self, *, tty: bool) -> None:
        self.tty = tty
        self.last = 0.0
        self.drawn = False

    def __call__(self, p: object) -> None:
        from sandcell.batch import BatchProgress

        assert isinstance(p, BatchProgress)
        now = time.monotonic()
        if not self.tty and now - self.last < _PLAIN_EVERY_S and p.done < p.total:
            return
        self.last = now
        rate = p.tasks_per_s
        left = p.total - p.done
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        text = (
            f"{p.done}/{p.total} done, {p.passed} passed, {p.done - p.passed} failed, "
            f"{rate:.1f} tasks/s, eta {eta}"
        )
        if self.tty:
            filled = round(_BAR_WIDTH * p.done / p.total) if p.total else _BAR_WIDTH
            bar = "#" * filled + "." * (_BAR_WIDTH - filled)
            sys.stderr.write(f"\r[{bar}] {text}\x1b[K")
            self.drawn = True
        else:
            sys.stderr.write(f"sandcell batch: {text}\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()


@contextmanager
def _stop_on_signals(stop: threading.Event, caught: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of killing the batch mid-write."""

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers; the caller stops us otherwise
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def handle(args: argparse.Namespace) -> int:
    from sandcell.batch import load_tasks, run_batch
    from sandcell.executor import Executor

    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        # Said of the option here: the tasks file would otherwise be blamed line by line.
        raise ConfigError(f"--timeout must be a positive number, got {args.timeout:g}")
    results = args.results or results_path_for(args.tasks)
    if results.resolve() == args.tasks.resolve():
        raise ConfigError("--results must not be the tasks file itself")
    warm = warm_config(args)
    stop = threading.Event()
    caught: list[int] = []
    if args.ray is not None:
        return _handle_ray(args, results, warm, stop, caught)
    with Executor(home=args.home, profile=args.profile, warm=warm, backend=args.backend) as ex:
        tasks = load_tasks(
            args.tasks,
            ex.profile,
            default_limits={"wall_time_s": args.timeout},
            mode=IsolationMode(args.isolation),
        )
        progress = _Progress(tty=sys.stderr.isatty())
        with _stop_on_signals(stop, caught):
            try:
                summary = run_batch(
                    ex,
                    tasks,
                    results,
                    concurrency=args.concurrency,
                    restart=args.restart,
                    stop=stop,
                    on_progress=progress,
                )
            finally:
                progress.end()
    return _report(args, summary, results, warm, caught, extra={})


def _handle_ray(
    args: argparse.Namespace,
    results: Path,
    warm: WarmConfig | None,
    stop: threading.Event,
    caught: list[int],
) -> int:
    """``--ray``: the same tasks and results file, run by one worker per Ray node."""
    from sandcell.batch import load_tasks
    from sandcell.home import data_dir
    from sandcell.policy.profiles import DEFAULT_PROFILE, load_profile
    from sandcell.ray._ray import import_ray
    from sandcell.ray.driver import run_batch_on_ray

    import_ray()  # before reading the tasks: a missing extra is said first, with its fix
    profile = load_profile(args.profile or os.environ.get("SANDCELL_PROFILE") or DEFAULT_PROFILE)
    tasks = load_tasks(
        args.tasks,
        profile,
        default_limits={"wall_time_s": args.timeout},
        mode=IsolationMode(args.isolation),
    )
    progress = _Progress(tty=sys.stderr.isatty())
    with _stop_on_signals(stop, caught):
        try:
            ray_summary = run_batch_on_ray(
                tasks,
                results,
                address=args.ray,
                profile=profile,
                home=args.home or data_dir(),
                concurrency=args.concurrency,
                backend=args.backend,
                warm=warm,
                pool_size_given=args.pool_size is not None,
                restart=args.restart,
                stop=stop,
                on_progress=progress,
            )
        finally:
            progress.end()
    extra = ray_summary.to_dict()["ray"]
    assert isinstance(extra, dict)
    return _report(args, ray_summary.batch, results, warm, caught, extra={"ray": extra})


def _report(
    args: argparse.Namespace,
    summary: BatchSummary,
    results: Path,
    warm: WarmConfig | None,
    caught: list[int],
    *,
    extra: dict[str, object],
) -> int:
    if summary.truncated_line is not None:
        print(
            f"sandcell: results line {summary.truncated_line} was incomplete (the last batch was "
            "killed while writing it); its task ran again",
            file=sys.stderr,
        )
    body = {
        **summary.to_dict(),
        "results": str(results),
        "concurrency": args.concurrency,
        "start_requested": args.start,
        "preload": list(warm.preload) if warm is not None else [],
        "pool_size": warm.pool_size if warm is not None and warm.mode == "pool" else None,
        **extra,
    }
    if args.json:
        print(json.dumps(body, ensure_ascii=False))
    else:
        _print_summary(body)
    interrupted_by: int | None = None
    if summary.interrupted:
        interrupted_by = int(caught[0] if caught else signal.SIGINT)
        print(
            f"sandcell: interrupted; {body['missing']} of {body['total']} tasks have no result: "
            "run the same command again to resume",
            file=sys.stderr,
        )
    return status.exit_code_for_batch(
        all_passed=summary.progress.passed == summary.progress.total,
        interrupted_by=interrupted_by,
    )


def _print_summary(body: dict[str, object]) -> None:
    outcomes = body["outcomes"]
    assert isinstance(outcomes, dict)
    total, passed, done = body["total"], body["passed"], body["done"]
    rate = 100.0 * float(passed) / float(done) if done else 0.0  # type: ignore[arg-type]
    print(f"{total} tasks: {passed} passed, {body['failed']} failed ({rate:.1f}% pass rate)")
    print("outcomes: " + (", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none"))
    print(
        f"this run: {body['ran']} tasks in {body['elapsed_s']} s, {body['tasks_per_s']} tasks/s "
        f"at concurrency {body['concurrency']} ({body['skipped']} already had results)"
    )
    starts = body["starts"]
    assert isinstance(starts, dict)
    shown = ", ".join(f"{k} {v}" for k, v in sorted(starts.items())) or "none"
    print(f"starts (--start {body['start_requested']}): {shown}")
    ray = body.get("ray")
    if isinstance(ray, dict):
        nodes = ray["nodes"]
        assert isinstance(nodes, list)
        homes = ", ".join(f"{n['node_id'][:12]} ({n['home']})" for n in nodes) or "none"
        print(f"ray: nodes {homes}; {ray['rerun_after_node_loss']} task(s) rerun after a node loss")
    print(f"results: {body['results']}")


__all__ = ["add_parser", "handle", "results_path_for", "warm_config"]
