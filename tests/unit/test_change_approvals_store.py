"""The store of decisions on runs' change sets (sandcell.changes.approvals), against both
databases (``store_backend``): a decision is found by its change set, applies once, and a later
denial overrules an earlier approval."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.changes.approvals import (
    FILENAME,
    ChangeApproval,
    ChangeApprovalError,
    ChangeApprovals,
)

pytestmark = pytest.mark.usefixtures("store_backend")

SHA = "ab" * 32
OTHER_SHA = "cd" * 32


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChangeApprovals]:
    with ChangeApprovals(tmp_path / FILENAME) as s:
        yield s


def test_an_approval_is_found_listed_and_applies_once(store: ChangeApprovals) -> None:
    approval = store.decide("run1", SHA, approve=True, by=" ana ", reason="looks right")
    assert (approval.status, approval.decided_by, approval.consumed_at) == ("approved", "ana", None)
    assert store.latest("run1", SHA) == approval
    assert store.latest("run1", OTHER_SHA) is None
    store.decide("run2", SHA, approve=False, by="bo")
    assert [a.run_id for a in store.list()] == ["run2", "run1"]
    assert store.list("run1") == [approval]
    assert store.list("nope") == []
    used = store.consume(approval.id, run_id="run1", changeset_sha256=SHA, target="/srv/app")
    assert (used.status, used.applied_to) == ("consumed", "/srv/app")
    assert used.consumed_at is not None
    with pytest.raises(ChangeApprovalError, match="already used"):
        store.consume(approval.id, run_id="run1", changeset_sha256=SHA, target="/srv/app")


def test_an_approval_fits_only_its_run_and_change_set(store: ChangeApprovals) -> None:
    approval = store.decide("run1", SHA, approve=True, by="ana")
    with pytest.raises(ChangeApprovalError, match="never given"):
        store.consume("c" + "0" * 32, run_id="run1", changeset_sha256=SHA, target="t")
    with pytest.raises(ChangeApprovalError, match="not run run2"):
        store.consume(approval.id, run_id="run2", changeset_sha256=SHA, target="t")
    with pytest.raises(ChangeApprovalError, match="approves another diff"):
        store.consume(approval.id, run_id="run1", changeset_sha256=OTHER_SHA, target="t")
    with pytest.raises(ChangeApprovalError, match="must not be empty"):
        store.decide("run1", SHA, approve=True, by=" ")
    assert store.latest("run1", SHA) == approval  # nothing was used up


def test_a_later_denial_overrules(store: ChangeApprovals) -> None:
    approval = store.decide("run1", SHA, approve=True, by="ana")
    denial = store.decide("run1", SHA, approve=False, by="bo", reason="no")
    assert store.latest("run1", SHA) == denial
    with pytest.raises(ChangeApprovalError, match="overruled: bo denied"):
        store.consume(approval.id, run_id="run1", changeset_sha256=SHA, target="t")
    with pytest.raises(ChangeApprovalError, match="was denied by bo"):
        store.consume(denial.id, run_id="run1", changeset_sha256=SHA, target="t")


def test_racing_consumers_exactly_one_applies(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    with ChangeApprovals(path) as first:
        approval = first.decide("run1", SHA, approve=True, by="ana")
    results: list[ChangeApproval | ChangeApprovalError] = []
    start = threading.Barrier(4)

    def consume(n: int) -> None:
        # Each its own connection, as separate `sandcell changes apply` processes would have.
        with ChangeApprovals(path) as mine:
            start.wait()
            try:
                results.append(
                    mine.consume(approval.id, run_id="run1", changeset_sha256=SHA, target=f"t{n}")
                )
            except ChangeApprovalError as e:
                results.append(e)

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [r for r in results if isinstance(r, ChangeApproval)]
    assert len(wins) == 1 and len(results) == 4, results
    assert all("already used" in str(r) for r in results if r not in wins)
