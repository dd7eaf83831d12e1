"""What the service keeps in memory of finished runs: bounded by count and by output size, runs
in flight never dropped (a dropped run answers from its record, as after a restart:
tests/service/test_lifecycle.py)."""

from __future__ import annotations

import pytest

from sandcell.service import core
from sandcell.service.core import RunState, Service


def _state(n: int, *, done: bool, stdout: str = "") -> RunState:
    state = RunState(id=f"run{n}", tenant="t")
    if done:
        state.result = {"stdout": stdout, "stderr": ""}
        state.done.set()
    return state


def _service(states: list[RunState]) -> Service:
    service = Service.__new__(Service)  # only the run table is needed here
    service.runs = {s.id: s for s in states}
    return service


def test_the_oldest_finished_runs_go_when_the_count_is_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "_KEPT_RUNS", 4)
    service = _service(
        [_state(0, done=False), _state(1, done=True), _state(2, done=True), _state(3, done=True)]
    )
    service._forget_finished()
    assert list(service.runs) == ["run0", "run2", "run3"]  # in flight kept, oldest done gone


def test_output_bounds_what_is_kept_even_under_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "_KEPT_OUTPUT_CHARS", 10)
    big = [_state(n, done=True, stdout="x" * 6) for n in range(3)]
    service = _service([*big, _state(9, done=False)])
    service._forget_finished()
    assert list(service.runs) == ["run2", "run9"]
    assert sum(s.kept_chars() for s in service.runs.values()) <= 10
