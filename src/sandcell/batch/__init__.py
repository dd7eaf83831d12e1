"""Batch runs: many independent programs from a JSON-lines file, each in a fresh sandbox.

>>> tasks = load_tasks(Path("tasks.jsonl"), executor.profile)            # doctest: +SKIP
>>> summary = run_batch(executor, tasks, Path("out.jsonl"), concurrency=2)  # doctest: +SKIP

:mod:`~sandcell.batch.tasks` reads and checks the task lines (every error with its line number
and field, before anything runs); :mod:`~sandcell.batch.judge` builds each program (the program,
then its test) and decides whether it passed; :mod:`~sandcell.batch.results` writes one durable
JSON line per finished task and reads them back to resume; :mod:`~sandcell.batch.runner` runs the
tasks on worker threads over one :class:`~sandcell.executor.Executor` and stops cleanly when
asked. ``sandcell batch`` (:mod:`sandcell.cli.batch`) is the command line over it.

Every task is an ordinary run: checked against the policy profile, run under its limits in its own
sandbox, recorded in the audit log; the result line carries its ``run_id``.

A task's verdict (``passed``) comes from a channel the program cannot write: its test runs in a
process of its own and reports with a secret the program never sees (:mod:`sandcell.batch.judge`,
:mod:`sandcell.batch._harness`).
"""

from __future__ import annotations

from sandcell.batch.judge import judge, program_for, stdin_for, stdout_difference
from sandcell.batch.results import ResultsFile
from sandcell.batch.runner import BatchProgress, BatchSummary, result_line, run_batch
from sandcell.batch.tasks import Task, load_tasks

__all__ = [
    "BatchProgress",
    "BatchSummary",
    "ResultsFile",
    "Task",
    "judge",
    "load_tasks",
    "program_for",
    "result_line",
    "run_batch",
    "stdin_for",
    "stdout_difference",
]
