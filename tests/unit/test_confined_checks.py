"""Schemas and textual invariants are evaluated in confined worker processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sandcell.errors import ConfigError
from sandcell.validation import ConfinedChecks, ConfinementLimits, validate_output

BACKTRACKING = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
EVIL = '{"s": "' + "a" * 40 + '!"}'


@pytest.fixture
def checks() -> Iterator[ConfinedChecks]:
    pool = ConfinedChecks(ConfinementLimits(cpu_seconds=1, workers=2))
    yield pool
    pool.close()


def test_a_backtracking_pattern_is_stopped_by_the_cpu_budget(checks: ConfinedChecks) -> None:
    report = validate_output(stdout=EVIL, stderr="", schema=BACKTRACKING, checks=checks)
    assert not report.valid and report.value is None
    assert len(report.errors) == 1
    assert report.errors[0].startswith("$: the check took more than 1 s of CPU time")
    # The worker that went over was replaced: the next check is answered.
    ok = validate_output(stdout='{"s": "aaa"}', stderr="", schema=BACKTRACKING, checks=checks)
    assert ok.valid and ok.value == {"s": "aaa"}


def test_the_caller_keeps_the_interpreter_while_a_check_runs(checks: ConfinedChecks) -> None:
    done = threading.Event()

    def check() -> None:
        validate_output(stdout=EVIL, stderr="", schema=BACKTRACKING, checks=checks)
        done.set()

    thread = threading.Thread(target=check)
    thread.start()
    while checks.busy == 0 and not done.is_set():
        done.wait(0.01)
    # Pure Python work in this thread needs the interpreter lock, which a regular expression
    # evaluated in this process would hold until the match ended.
    total = sum(i * i for i in range(200_000))
    assert total > 0 and not done.is_set()
    thread.join()
    assert done.is_set()


def test_invariants_keep_their_order_and_names_across_the_boundary(
    checks: ConfinedChecks,
) -> None:
    def positive(value: object) -> bool:
        return isinstance(value, dict) and value["n"] > 0

    report = validate_output(
        stdout='{"n": -1}',
        stderr="",
        invariants=['result["n"] == 1', positive, 'result["n"] < 0', 'result["n"] > 5'],
        checks=checks,
    )
    assert report.errors == (
        """invariant 'result["n"] == 1' does not hold""",
        "invariant #2 (positive) does not hold",
        """invariant 'result["n"] > 5' does not hold""",
    )


def test_invariants_are_not_evaluated_when_the_schema_fails(checks: ConfinedChecks) -> None:
    report = validate_output(
        stdout='{"n": "x"}',
        stderr="",
        schema={"properties": {"n": {"type": "integer"}}},
        invariants=['result["n"] > 0'],
        checks=checks,
    )
    assert report.errors == ("$.n: 'x' is not of type 'integer'",)


def test_a_runaway_invariant_is_stopped_inside_the_worker(checks: ConfinedChecks) -> None:
    clauses = " ".join(f"for v{i} in [v{i - 1} * v{i - 1}]" for i in range(1, 40))
    source = f'all(True for v0 in [result["n"]] {clauses})'
    report = validate_output(stdout='{"n": 3}', stderr="", invariants=[source], checks=checks)
    assert len(report.errors) == 1 and "bits" in report.errors[0]


def test_a_schema_that_cannot_be_used_is_still_a_config_error(checks: ConfinedChecks) -> None:
    with pytest.raises(ConfigError, match="cannot be resolved"):
        validate_output(
            stdout='{"n": 1}',
            stderr="",
            schema={"$ref": "https://example.invalid/s.json"},
            checks=checks,
        )
    assert validate_output(stdout='{"n": 1}', stderr="", schema={}, checks=checks).valid


def test_a_check_that_runs_out_of_memory_fails_the_result_not_the_caller() -> None:
    pool = ConfinedChecks(ConfinementLimits(memory_bytes=96 * 2**20, workers=1))
    try:
        big = '{"s": "' + "x" * (48 * 2**20) + '"}'
        report = validate_output(stdout=big, stderr="", schema={"type": "object"}, checks=pool)
        assert not report.valid
        assert "memory" in report.errors[0], report.errors
        assert validate_output(stdout="{}", stderr="", schema={}, checks=pool).valid
    finally:
        pool.close()
