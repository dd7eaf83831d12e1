"""Audit verification for tenants, off the serving path and bounded.

Each verification runs in a process of its own (:mod:`sandcell.service.audit_verify_job`);
the event loop only waits for its answer, so ``/healthz``, runs and every other tenant keep
being served while a long log is checked. Bounds, so that no tenant can take more than its
share:

- one verification per tenant at a time: a second request while the first runs is answered
  429, naming the running one (header ``X-Sandcell-Verification``), whichever surface asks;
- at most ``processes`` verification processes at once for the whole service, and at most
  ``waiting`` requests queued behind them; past that, 429 with ``Retry-After``;
- a verification that takes longer than ``timeout_s`` is killed and answered 503, as is a
  request whose client went away (its process is killed, not left running).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sandcell
from sandcell.service.problems import ServiceProblem

__all__ = ["AuditVerifications", "TenantVerification"]

_JOB = "sandcell.service.audit_verify_job"
_STDERR_SHOWN = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantVerification:
    """What one tenant learns of a verification of the whole log."""

    ok: bool
    """The whole chain is intact (every tenant's records)."""
    count: int
    """Records in the whole log."""
    records: int
    """How many of them are the tenant's."""
    problems: tuple[dict[str, object], ...]
    """Problems in the tenant's records."""
    other_problems: int
    """Problems in records that are not the tenant's (counted, never shown)."""


class AuditVerifications:
    """The service's verifications; all bookkeeping happens on the event loop (no lock)."""

    def __init__(
        self,
        *,
        audit: Path,
        service_db: Path,
        processes: int = 2,
        waiting: int = 8,
        timeout_s: float = 600.0,
    ) -> None:
        self._audit = audit
        self._service_db = service_db
        self._processes = processes
        self._waiting = waiting
        self._timeout_s = timeout_s
        self._running: dict[str, str] = {}
        """tenant id → the id of its verification (queued or running)."""
        self._slots: asyncio.Semaphore | None = None

    def running(self, tenant: str) -> str | None:
        """The id of the tenant's verification in progress, if any."""
        return self._running.get(tenant)

    async def verify(self, tenant: str) -> TenantVerification:
        """Verify the log for ``tenant`` (an id); 429 when one of its own is in progress or
        the service is full of them, 503 when it could not be done."""
        current = self._running.get(tenant)
        if current is not None:
            raise ServiceProblem(
                429,
                f"a verification of the audit log for this tenant is in progress "
                f"({current}); wait for its answer, then ask again",
                headers={"Retry-After": "5", "X-Sandcell-Verification": current},
            )
        if len(self._running) >= self._processes + self._waiting:
            raise ServiceProblem(
                429,
                f"the service is verifying the audit log for {len(self._running)} tenants, "
                "its limit; retry later",
                headers={"Retry-After": "30"},
            )
        job = "v" + secrets.token_hex(6)
        self._running[tenant] = job
        try:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self._processes)
            async with self._slots:
                answer = await self._run(tenant)
        finally:
            del self._running[tenant]
        return TenantVerification(
            ok=bool(answer["ok"]),
            count=int(answer["count"]),
            records=int(answer["records"]),
            problems=tuple(dict(p) for p in answer["problems"]),
            other_problems=int(answer["other_problems"]),
        )

    async def _run(self, tenant: str) -> dict[str, Any]:
        asked = json.dumps(
            {"audit": str(self._audit), "service_db": str(self._service_db), "tenant": tenant}
        ).encode()
        # The child imports this very sandcell, wherever it was installed from.
        source = str(Path(sandcell.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            _JOB,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(asked), self._timeout_s)
        except TimeoutError:
            raise ServiceProblem(
                503,
                f"verifying the audit log took longer than {self._timeout_s:g} s and was "
                "stopped; ask the operator to run `sandcell audit verify` on the host",
            ) from None
        finally:
            # Cancelled (the client left) or timed out: the process goes with the request.
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            why = err.decode("utf-8", "replace").strip().splitlines()
            raise ServiceProblem(
                503,
                "the audit log could not be verified: "
                + (why[-1][:_STDERR_SHOWN] if why else f"exit status {proc.returncode}"),
            )
        answer: dict[str, Any] = json.loads(out)
        return answer
