"""The grace a node gives an orphaned session beyond its idle timeout: ten seconds, or what
``$SANDCELL_CLUSTER_IDLE_GRACE_S`` says on the node (the cluster tests wait one second)."""

from __future__ import annotations

import pytest

from sandcell.cluster.cells import IDLE_GRACE_ENV, IDLE_GRACE_S, configured_idle_grace_s


def test_the_default_grace_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IDLE_GRACE_ENV, raising=False)
    assert configured_idle_grace_s() == IDLE_GRACE_S == 10.0


@pytest.mark.parametrize(("value", "grace"), [("1", 1.0), ("0.5", 0.5), ("-3", 0.0)])
def test_the_variable_sets_the_grace(
    monkeypatch: pytest.MonkeyPatch, value: str, grace: float
) -> None:
    monkeypatch.setenv(IDLE_GRACE_ENV, value)
    assert configured_idle_grace_s() == grace


def test_a_value_that_is_no_number_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IDLE_GRACE_ENV, "soon")
    assert configured_idle_grace_s() == IDLE_GRACE_S
