"""The pieces of the E2B API's sandboxes that last that need no server: the labels a sandbox
keeps with its saved state, the mode a pause takes, and which sandboxes a listing names."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from sandcell.backends.cell.state import PauseMode
from sandcell.e2b.errors import E2BError
from sandcell.e2b.labels import SandboxLabels
from sandcell.e2b.listing import ListQuery
from sandcell.e2b.pausing import chosen_mode

LABELS = SandboxLabels(
    template="code-interpreter-v1",
    metadata={"job": "a=b&c"},
    env={"API": "x"},
    token="t0k",
    key_sha256="ab" * 32,
    started_at=dt.datetime(2026, 12, 6, 10, 0, tzinfo=dt.UTC),
    workspace="/home/user",
    auto_pause="best",
    contexts=(("c1", "python", "/home/user/sub", "/home/user/sub"),),
)
BOTH = frozenset({PauseMode.MEMORY, PauseMode.FILES})
FILES = frozenset({PauseMode.FILES})


def test_labels_round_trip_and_refuse_what_is_not_a_sandbox() -> None:
    raw = LABELS.to_labels()
    assert all(k.startswith("e2b.") for k in raw)
    assert SandboxLabels.of(raw) == LABELS
    assert SandboxLabels.of({}) is None  # a session of sandcell's own API
    assert SandboxLabels.of({**raw, "e2b.metadata": "{not json"}) is None
    assert SandboxLabels.of({**raw, "e2b.auto_pause": "sometimes"}) is None
    missing = dict(raw)
    del missing["e2b.token"]
    assert SandboxLabels.of(missing) is None


def test_the_mode_of_a_pause() -> None:
    assert chosen_mode(BOTH, None) is PauseMode.MEMORY
    assert chosen_mode(FILES, None) is PauseMode.FILES
    assert chosen_mode(BOTH, False) is PauseMode.FILES
    assert chosen_mode(BOTH, True) is PauseMode.MEMORY
    with pytest.raises(E2BError, match="keeps only its files") as refused:
        chosen_mode(FILES, True)
    assert refused.value.status == 400
    assert LABELS.auto_pause_mode(BOTH) is PauseMode.MEMORY
    assert LABELS.auto_pause_mode(FILES) is PauseMode.FILES


@dataclass(frozen=True)
class _Box:
    id: str
    template: str
    metadata: dict[str, str]
    started_at: dt.datetime
    state: str


def test_a_listing_names_running_and_paused_sandboxes() -> None:
    t = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    boxes = [
        _Box("a", "base", {}, t, "running"),
        _Box("b", "base", {}, t + dt.timedelta(seconds=1), "paused"),
    ]
    both = ListQuery.of({})
    assert [b.id for b in boxes if both.matches(b)] == ["a", "b"]
    paused = ListQuery.of({"state": "paused"})
    assert [b.id for b in boxes if paused.matches(b)] == ["b"]
    page, token = ListQuery.of({"limit": "1", "order": "desc"}).page(boxes)
    assert [b.id for b in page] == ["b"] and token is not None
    with pytest.raises(E2BError, match="running and/or paused"):
        ListQuery.of({"state": "gone"})
