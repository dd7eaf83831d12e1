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
    return state


def _service(states: list[RunState]) -> Service:
    service = Service.__new__(Service)  # only the run table is needed here
    service.runs = {s.id: s for s in states}
    service._ended, service._ended_chars = {}, 0
    for state in states:
        if state.result is not None:
            service._note_ended(state)  # as a run's end does (Service._drive)
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


def test_what_is_kept_is_counted_as_runs_end_and_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "_KEPT_RUNS", 3)
    running = _state(0, done=False)
    service = _service([running, _state(1, done=True, stdout="abc")])
    running.result = {"stdout": "de", "stderr": "f"}
    service._note_ended(running)
    assert running.done.is_set()
    assert service._ended_chars == 6
    service.runs["run2"] = _state(2, done=False)
    service._forget_finished()
    assert list(service.runs) == ["run1", "run2"]  # the oldest finished went: count at 3
    assert service._ended == {"run1": 3} and service._ended_chars == 3
    service._note_ended(RunState(id="elsewhere", tenant="t"))  # not one of its runs
    assert service._ended_chars == 3
