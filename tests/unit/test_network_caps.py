"""The proxy's caps: invalid settings are refused, and the counters refuse past each cap."""

from __future__ import annotations

import pytest

from sandcell.errors import ConfigError
from sandcell.network.caps import Budget, ProxyLimits


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_concurrent", 0),
        ("max_connections", -1),
        ("max_bytes_up", True),
        ("max_bytes_down", 1.5),
        ("idle_timeout_s", 0),
        ("connect_timeout_s", "10"),
        ("max_head_bytes", 100),
    ],
)
def test_invalid_limits_are_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ProxyLimits(**{field: value})  # type: ignore[arg-type]


def test_the_budget_refuses_past_each_cap_and_counts_bytes() -> None:
    budget = Budget(ProxyLimits(max_concurrent=2, max_connections=3, max_bytes_up=10))
    assert budget.admit() is None and budget.admit() is None
    refused = budget.admit()
    assert refused is not None and refused[0] == 503 and "2 connections at once" in refused[1]
    budget.release()
    assert budget.admit() is None
    budget.release()
    refused = budget.admit()
    assert refused is not None and refused[0] == 429 and "cap of 3 connections" in refused[1]
    budget.spend(True, 7)
    assert budget.allowance(True) == 3 and budget.allowance(False) == 512 * 2**20
