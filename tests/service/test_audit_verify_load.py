"""A tenant verifying a large audit log takes nothing from the others: the service keeps
answering ``/healthz`` while the verification runs, one verification per tenant at a time.

The log is real (an audit log in the service's home, its chain hashed as sandcell hashes it)
and large enough that verifying it is seconds of work; the test waits for the event it needs
(the tenant's verification is in progress: a request sent with it is refused, naming it), never
for a time."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from tests.service.server import ServiceProcess, add_tenant

from sandcell.audit import AuditLog
from sandcell.audit.chain import GENESIS_HASH, canonical_json, chain_hash
from sandcell.service.tenants import TenantStore

RECORDS = 150_000


def fill_audit_log(path: Path, count: int) -> list[str]:
    """Append ``count`` records to the log at ``path`` as :meth:`AuditLog.append` chains them
    (in one transaction, to build a large log quickly); their run ids."""
    AuditLog(path).close()  # the schema, as sandcell makes it
    conn = sqlite3.connect(path)
    try:
        count0, prev = conn.execute("SELECT count, hash FROM head").fetchone()
        rows, ids = [], []
        for seq in range(count0 + 1, count0 + count + 1):
            run_id = uuid.uuid4().hex
            text = canonical_json(
                {"run_id": run_id, "outcome": "ok", "stdout": "x" * 200, "language": "python"}
            )
            digest = chain_hash(seq, prev, text)
            rows.append((seq, run_id, "2026-01-01T00:00:00+00:00", text, prev, digest))
            ids.append(run_id)
            prev = digest
        conn.executemany(
            "INSERT INTO runs (seq, run_id, created_at, record, prev_hash, hash) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("UPDATE head SET count = ?, hash = ?", (count0 + count, prev))
        conn.commit()
    finally:
        conn.close()
    assert prev != GENESIS_HASH
    return ids


@pytest.fixture(scope="module")
def loaded(home: Path) -> Iterator[tuple[ServiceProcess, str, str]]:
    key = add_tenant(home, "verifier")
    other = add_tenant(home, "bystander")
    ids = fill_audit_log(home / "audit.sqlite3", RECORDS + 1)
    with TenantStore.in_home(home) as store:
        store.own(store.get("verifier").id, "run", ids[:RECORDS])  # the last is nobody's
    proc = ServiceProcess(home).start()
    yield proc, key, other
    proc.stop()  # any exit status: a failed test may leave a request open


def test_healthz_answers_while_a_tenant_verifies_a_large_log(
    loaded: tuple[ServiceProcess, str, str],
) -> None:
    service, key, other = loaded
    answers: list[httpx2.Response] = []
    answered = threading.Condition()

    def verify() -> None:
        with service.client(key) as c:
            answer = c.get("/v1/audit/verify")
        with answered:
            answers.append(answer)
            answered.notify_all()

    # The tenant asks twice at once: one request verifies, the other is refused at once, naming
    # the verification in progress. That refusal is the event this test waits for.
    both = [threading.Thread(target=verify) for _ in range(2)]
    for thread in both:
        thread.start()
    try:
        with answered:
            answered.wait_for(lambda: len(answers) >= 1, timeout=600)
        refused = answers[0]
        assert refused.status_code == 429, (
            f"the second request was not refused while the first verified: {refused.text}"
        )
        running = refused.headers["X-Sandcell-Verification"]
        with service.client(None) as anyone, service.client(other) as bystander:
            assert anyone.get("/healthz").status_code == 200
            assert bystander.get("/v1/profiles").status_code == 200  # another tenant is served
        # Still the same verification: /healthz answered while it ran.
        with service.client(key) as tenant:
            still = tenant.get("/v1/audit/verify")
        assert still.status_code == 429, still.text
        assert still.headers["X-Sandcell-Verification"] == running
        assert "in progress" in still.json()["detail"]
    finally:
        for thread in both:
            thread.join()
    done = answers[1]
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["ok"] is True and body["records"] == RECORDS and body["problems"] == []
    # Another tenant verifies too: the whole chain, none of it its own.
    with service.client(other) as bystander:
        theirs = bystander.get("/v1/audit/verify").json()
        assert theirs["ok"] is True and theirs["records"] == 0


def test_a_tenant_sees_the_problems_in_its_own_records_only(
    loaded: tuple[ServiceProcess, str, str], home: Path
) -> None:
    service, key, _ = loaded
    conn = sqlite3.connect(home / "audit.sqlite3")
    try:
        # One of the tenant's records and the one that is nobody's, edited outside sandcell.
        for seq in (7, RECORDS + 1):
            conn.execute(
                "UPDATE runs SET record = replace(record, '\"ok\"', '\"error\"') WHERE seq = ?",
                (seq,),
            )
        conn.commit()
        [(mine,)] = conn.execute("SELECT run_id FROM runs WHERE seq = 7").fetchall()
    finally:
        conn.close()
    with service.client(key) as c:
        body = c.get("/v1/audit/verify").json()
    assert body["ok"] is False and body["records"] == RECORDS
    assert [(p["kind"], p["run_id"]) for p in body["problems"]] == [("changed", mine)]
    assert body["other_problems"] == 1
