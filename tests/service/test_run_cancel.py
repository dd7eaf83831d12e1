"""Per-run cancellation, which the service's cancel endpoint stands on: one run is stopped,
the others are not."""

from __future__ import annotations

from sandcell.backends.host.runs import RunRegistry


def test_cancel_reaches_one_run_only() -> None:
    registry = RunRegistry()
    killed: list[str] = []
    with (
        registry.register("a", lambda: killed.append("a")) as first,
        registry.register("b", lambda: killed.append("b")) as second,
    ):
        assert registry.cancel("a", "enough") is True
        assert killed == ["a"]
        assert first.reason == "enough" and second.reason is None
        assert registry.cancel("a", "again") is True  # killed again, first reason kept
        assert first.reason == "enough" and killed == ["a", "a"]
        assert registry.cancel("nope", "x") is False
    assert registry.cancel("b", "too late") is False
    assert killed == ["a", "a"]
