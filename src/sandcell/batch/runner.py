"""The batch runner: N worker threads over one Executor, a result line per finished task.

Tasks with a line in the results file already are skipped (resume). Each worker takes the next
task, runs it in a fresh sandbox through :meth:`Executor.run` (policy, limits, record: exactly as
``sandcell run``), judges it and appends its result line. A task whose request no run can take
(ConfigError) gets a ``refused`` line and the batch goes on; any other failure belongs to the host
and stops the batch. Setting ``stop`` (the CLI does on
SIGINT and SIGTERM) ends the batch: no new task starts, the runs in flight are cancelled
(:meth:`Executor.cancel_all`), and they are not written as results, so a rerun runs them again.
Their run records stay in the audit log, as runs killed with the reason "cancelled: the batch
was interrupted".
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.batch.judge import checked_request, judge, new_secret, sandbox_request, strip_verdict
from sandcell.batch.results import Recorded, ResultsFile
from sandcell.batch.tasks import Task
from sandcell.errors import ConfigError
from sandcell.spec import RunResult, artifact_to_dict

if TYPE_CHECKING:
    from sandcell.executor import Executor

_TEXT_KEPT = 4000
"""Characters of stdout (its start) and stderr (its end) kept in a result line; the run record
(``sandcell audit show RUN_ID``) has all of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchProgress:
    """Where a batch stands: counts over every task of the file."""

    total: int
    done: int
    """Tasks with a result line (earlier sessions included)."""
    passed: int
    skipped: int
    """Tasks that had a result line before this session started."""
    ran: int
    """Result lines written by this session."""
    elapsed_s: float
    """Seconds since this session's first task started."""

    @property
    def tasks_per_s(self) -> float:
        return self.ran / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSummary:
    """How a batch ended."""

    progress: BatchProgress
    outcomes: Mapping[str, int] = field(default_factory=dict)
    """Outcome → number of tasks, over every task with a result line."""
    failed_ids: tuple[str, ...] = ()
    """Tasks with a result that did not pass, in file order."""
    interrupted: bool = False
    """True when ``stop`` ended the batch before every task had a result."""
    truncated_line: int | None = None
    """An incomplete last line of the results file that was cut off (its task ran again)."""
    starts: Mapping[str, int] = field(default_factory=dict)
    """Start mode (``cold``, ``template``, ``pool``) → tasks this session ran that way."""

    @property
    def complete(self) -> bool:
        return self.progress.done == self.progress.total

    @property
    def pass_rate(self) -> float:
        done = self.progress.done
        return self.progress.passed / done if done else 0.0

    def to_dict(self) -> dict[str, object]:
        p = self.progress
        return {
            "total": p.total,
            "done": p.done,
            "passed": p.passed,
            "failed": p.done - p.passed,
            "missing": p.total - p.done,
            "skipped": p.skipped,
            "ran": p.ran,
            "elapsed_s": round(p.elapsed_s, 3),
            "tasks_per_s": round(p.tasks_per_s, 3),
            "pass_rate": round(self.pass_rate, 4),
            "outcomes": dict(self.outcomes),
            "failed_ids": list(self.failed_ids),
            "interrupted": self.interrupted,
            "complete": self.complete,
            "starts": dict(self.starts),
        }


ProgressCallback = Callable[[BatchProgress], None]


def result_line(task: Task, result: RunResult, secret: str, *, backend: str) -> dict[str, object]:
    """The JSON line recorded for one finished task (``secret``: the run's, see the judge).

    ``backend`` names the rung the batch runs on; a run that reached a sandbox names its own.
    """
    passed, mismatch = judge(task, result, secret)
    stderr = strip_verdict(result.stderr, secret)
    return {
        "id": task.id,
        "line": task.line,
        "task_sha256": task.sha256,
        "backend": result.enforcement.backend if result.enforcement else backend,
        "outcome": result.outcome.value,
        "passed": passed,
        "mismatch": mismatch,
        "reason": result.reason,
        "run_id": result.run_id,
        "start": result.start.mode,
        # A warm start was asked for but the backend started this run cold: its reason.
        "start_note": _cold_reason(result),
        "exit_code": result.exit_code,
        "signal": result.signal,
        "wall_ms": result.usage.wall_ms,
        "cpu_ms": result.usage.cpu_ms,
        "peak_memory_bytes": result.usage.peak_memory_bytes,
        "stdout": result.stdout[:_TEXT_KEPT],
        "stderr": stderr[-_TEXT_KEPT:],
        "output_cut": len(result.stdout) > _TEXT_KEPT or len(stderr) > _TEXT_KEPT,
        "artifacts": [artifact_to_dict(a) for a in result.artifacts],
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
    }


REFUSED = "refused"
"""The outcome of a task whose request no run could take (ConfigError): it never ran. Resuming
runs it again, as it does ``infra_error``, so a fixed input is picked up without --restart."""


def refused_line(task: Task, error: ConfigError, backend: str) -> dict[str, object]:
    """The JSON line recorded for a task refused before any run (no run id, no output)."""
    return {
        "id": task.id,
        "line": task.line,
        "task_sha256": task.sha256,
        "backend": backend,
        "outcome": REFUSED,
        "passed": False,
        "mismatch": None,
        "reason": f"task on line {task.line}: {error}",
        "run_id": None,
        "start": None,
        "start_note": None,
        "exit_code": None,
        "signal": None,
        "wall_ms": None,
        "cpu_ms": None,
        "peak_memory_bytes": None,
        "stdout": "",
        "stderr": "",
        "output_cut": False,
        "artifacts": [],
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
    }


def run_task(executor: Executor, task: Task) -> dict[str, object]:
    """Run one task in a fresh sandbox and return its result line (``refused`` when no run can
    take its request). The local batch and the Ray workers (:mod:`sandcell.ray`) both run tasks
    through this, so a task means the same wherever it runs."""
    secret = new_secret()
    # The profile checks the program and its test; the sandbox runs them under the harness,
    # whose verdict carries the secret.
    wrap = functools.partial(sandbox_request, task=task, secret=secret)
    try:
        result = executor.run(checked_request(task), wrap=wrap)
    except ConfigError as exc:
        # This task's request is at fault (an input the sandbox cannot take, an export beyond
        # the profile): its own result, and the batch goes on.
        return refused_line(task, exc, executor.backend.name)
    return result_line(task, result, secret, backend=executor.backend.name)


def _cold_reason(result: RunResult) -> str | None:
    note = result.enforcement.layers.get("warm_start") if result.enforcement else None
    return note.removeprefix("not used: ") if note and note.startswith("not used: ") else None


class _Batch:
    """The shared state of one session's workers."""

    def __init__(
        self,
        executor: Executor,
        tasks: Sequence[Task],
        results: ResultsFile,
        stop: threading.Event,
        on_progress: ProgressCallback | None,
    ) -> None:
        self.executor = executor
        self.results = results
        self.stop = stop
        self.on_progress = on_progress
        self.total = len(tasks)
        self.lock = threading.Lock()
        # Outcome and verdict per task with a result: the output itself stays on disk only.
        self.verdicts: dict[str, Recorded] = {
            t.id: results.recorded[t.id] for t in tasks if t.id in results.recorded
        }
        self.passed = sum(1 for v in self.verdicts.values() if v.passed)
        self.skipped = len(self.verdicts)
        self.pending = iter([t for t in tasks if t.id not in self.verdicts])
        self.ran = 0
        self.starts: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self.error: BaseException | None = None

    def progress(self) -> BatchProgress:
        return BatchProgress(
            total=self.total,
            done=len(self.verdicts),
            passed=self.passed,
            skipped=self.skipped,
            ran=self.ran,
            elapsed_s=time.monotonic() - self.t0,
        )

    def next_task(self) -> Task | None:
        with self.lock:
            if self.stop.is_set():
                return None
            return next(self.pending, None)

    def work(self) -> None:
        while (task := self.next_task()) is not None:
            try:
                line = run_task(self.executor, task)
                mode = line["start"]
                if line["outcome"] != REFUSED and self.stop.is_set():
                    return  # killed by the interrupt (or finished as it came): run it again
                with self.lock:
                    self.results.append(line)
                    verdict = Recorded.of(line)
                    self.verdicts[task.id] = verdict
                    self.passed += verdict.passed
                    self.ran += 1
                    if isinstance(mode, str):
                        self.starts[mode] += 1
                    if self.on_progress is not None:
                        self.on_progress(self.progress())
            except BaseException as exc:
                # A batch that cannot attempt a run (the host lost a layer, the disk is full)
                # stops as a whole, rather than writing the same failure for every task left.
                with self.lock:
                    if not self.stop.is_set() and self.error is None:
                        self.error = exc
                self.stop.set()
                return


def refuse_stale(tasks: Sequence[Task], results: ResultsFile) -> None:
    """A result recorded for another version of a task would be kept as if it were this one's."""
    stale = [
        t.id
        for t in tasks
        if t.id in results.recorded and results.recorded[t.id].task_sha256 != t.sha256
    ]
    if stale:
        shown = ", ".join(repr(i) for i in stale[:10]) + (" ..." if len(stale) > 10 else "")
        raise ConfigError(
            f"results file {str(results.path)!r} has results for {len(stale)} task(s) that "
            f"changed since they ran ({shown}); start over with --restart, or pass another "
            "--results file"
        )


def _wait(executor: Executor, workers: Sequence[threading.Thread], stop: threading.Event) -> None:
    """Until every worker has returned; once ``stop`` is set, cancel the runs in flight."""
    while any(w.is_alive() for w in workers):
        if stop.wait(0.2):
            # A run can start between two calls (a worker was between its check and the
            # launch), so cancel until every worker has returned.
            executor.cancel_all("the batch was interrupted")
            for w in workers:
                w.join(0.05)


def run_batch(
    executor: Executor,
    tasks: Sequence[Task],
    results_path: Path,
    *,
    concurrency: int,
    restart: bool = False,
    stop: threading.Event | None = None,
    on_progress: ProgressCallback | None = None,
) -> BatchSummary:
    """Run every task of ``tasks`` without a result line in ``results_path``; see the module.

    Raises what stopped the batch when a run could not be attempted at all (a SandcellError
    such as IsolationUnavailable); the lines written until then stay.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    stop = stop or threading.Event()
    with ResultsFile(results_path, restart=restart) as results:
        refuse_stale(tasks, results)
        batch = _Batch(executor, tasks, results, stop, on_progress)
        workers = [
            threading.Thread(target=batch.work, name=f"sandcell-batch-{i}", daemon=True)
            for i in range(concurrency)
        ]
        if on_progress is not None and batch.skipped:
            on_progress(batch.progress())
        for w in workers:
            w.start()
        try:
            _wait(executor, workers, stop)
        except KeyboardInterrupt:
            # A caller without signal handlers of its own: stop as cleanly as on ``stop``.
            stop.set()
            _wait(executor, workers, stop)
            raise
        if batch.error is not None:
            raise batch.error
        progress = batch.progress()
        done = [(t.id, batch.verdicts[t.id]) for t in tasks if t.id in batch.verdicts]
        return BatchSummary(
            progress=progress,
            outcomes=dict(Counter(v.outcome for _, v in done)),
            failed_ids=tuple(task_id for task_id, v in done if not v.passed),
            interrupted=stop.is_set() and progress.done < progress.total,
            truncated_line=results.truncated_line,
            starts=dict(batch.starts),
        )


__all__ = [
    "REFUSED",
    "BatchProgress",
    "BatchSummary",
    "ProgressCallback",
    "refuse_stale",
    "refused_line",
    "result_line",
    "run_batch",
    "run_task",
]
