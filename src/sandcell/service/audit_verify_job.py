"""One tenant's audit verification, as a process of its own.

``python -m sandcell.service.audit_verify_job`` reads ``{"audit": PATH, "service_db": PATH,
"tenant": ID}`` on stdin and writes one JSON object on stdout: whether the whole chain is
intact (``ok``, ``count``), how many records are the tenant's (``records``), the problems in
them (``problems``) and how many problems are in records that are not (``other_problems``).

Why a process: verifying re-reads and re-hashes every tenant's records (the chain is one), in
Python, for as long as the log is long. In the service process that time was taken from every
tenant (the interpreter lock, the worker threads that run sandboxes, the lock of the audit log
that every run's record waits on). Here it has its own interpreter and its own connections,
and the service only waits for the answer (:mod:`sandcell.service.audit_verification`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sandcell.audit import AuditLog
from sandcell.service.tenants import TenantStore

__all__ = ["verify_for_tenant"]


def verify_for_tenant(audit: Path, service_db: Path, tenant: str) -> dict[str, object]:
    """The answer for ``tenant`` (see the module)."""
    with TenantStore(service_db) as store:
        mine = store.all_owned(tenant, "run")
    with AuditLog(audit) as log:
        report = log.verify()
        present = log.run_ids()
    own = [p for p in report.problems if p.run_id in mine]
    return {
        "ok": report.ok,
        "count": report.count,
        "records": len(mine & present),
        "problems": [
            {"kind": p.kind, "seq": p.seq, "run_id": p.run_id, "detail": p.detail} for p in own
        ],
        "other_problems": len(report.problems) - len(own),
    }


def main() -> int:
    asked = json.loads(sys.stdin.read())
    answer = verify_for_tenant(
        Path(str(asked["audit"])), Path(str(asked["service_db"])), str(asked["tenant"])
    )
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
