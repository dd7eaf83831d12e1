"""The registry of runs in flight behind ``cancel_all`` (no sandbox needed)."""

from __future__ import annotations

import threading

import pytest

from sandcell.backends.host.process import StopPipe
from sandcell.backends.host.runs import RunRegistry
from sandcell.errors import ConfigError


def test_cancel_all_reaches_only_the_runs_in_flight() -> None:
    runs = RunRegistry()
    killed: list[str] = []
    assert runs.cancel_all("nothing yet") == 0
    with runs.register("a", lambda: killed.append("a")) as a:
        with runs.register("b", lambda: killed.append("b")) as b:
            assert set(runs.in_flight()) == {"a", "b"}
            assert not a.cancelled
            assert runs.cancel_all("first") == 2
            assert (a.reason, b.reason) == ("first", "first")
        # A run already cancelled keeps its first reason; its kill is called again.
        assert runs.cancel_all("second") == 1
        assert a.reason == "first"
    assert runs.in_flight() == ()
    assert runs.cancel_all("after") == 0
    assert sorted(killed) == ["a", "a", "b"]


def test_a_run_leaves_the_registry_even_when_it_fails() -> None:
    runs = RunRegistry()
    with pytest.raises(RuntimeError), runs.register("a", lambda: None):
        raise RuntimeError("the run failed")
    assert runs.in_flight() == ()


def test_one_run_id_at_a_time() -> None:
    runs = RunRegistry()
    with (
        runs.register("a", lambda: None),
        pytest.raises(ConfigError, match="already in flight"),
        runs.register("a", lambda: None),
    ):
        pass


def test_a_failing_kill_does_not_spare_the_others() -> None:
    runs = RunRegistry()
    killed: list[str] = []

    def broken() -> None:
        raise ProcessLookupError("gone")

    with (
        runs.register("a", broken),
        runs.register("b", lambda: killed.append("b")),
        pytest.raises(ProcessLookupError),
    ):
        runs.cancel_all("stop")
    assert killed == ["b"]


def test_stop_pipe_wakes_a_reader_from_another_thread() -> None:
    import select

    stop = StopPipe()
    try:
        assert select.select([stop.r], [], [], 0)[0] == []
        t = threading.Thread(target=stop.set)
        t.start()
        t.join()
        assert select.select([stop.r], [], [], 5)[0] == [stop.r]
        for _ in range(100_000):  # never blocks, even once the pipe is full
            stop.set()
    finally:
        stop.close()
