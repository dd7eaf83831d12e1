"""The executor: the one object every surface (CLI, Python, later HTTP, MCP, the agent) runs
code through.

``Executor.run`` = validate the request → run it on a backend in a fresh sandbox → export the
declared files → write the run record → return the typed result. ``run_async`` is the same for
asyncio.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import TracebackType

import platformdirs

from sandcell.artifacts import ArtifactStore, ExportLimits, collect_exports, validate_globs
from sandcell.audit import AuditLog
from sandcell.backends.base import Backend, BackendResult
from sandcell.errors import InfraError
from sandcell.inputs import inspect_inputs
from sandcell.runtimes import runtime_for
from sandcell.spec import (
    Artifact,
    Outcome,
    RejectedExport,
    RunRequest,
    RunResult,
    Usage,
)


def data_dir() -> Path:
    """Where records and artifacts live: ``$SANDCELL_HOME``, else the user's data directory."""
    explicit = os.environ.get("SANDCELL_HOME")
    return Path(explicit) if explicit else platformdirs.user_data_path("sandcell")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Executor:
    """Runs requests in fresh sandboxes and keeps a record of each run.

    >>> with Executor() as ex:                                   # doctest: +SKIP
    ...     result = ex.run(RunRequest(code="print(6*7)"))
    ...     result.stdout
    '42\\n'
    """

    def __init__(
        self,
        *,
        backend: Backend | None = None,
        audit: AuditLog | None = None,
        store: ArtifactStore | None = None,
        export_limits: ExportLimits | None = None,
        home: Path | None = None,
    ) -> None:
        base = home or data_dir()
        if backend is None:
            from sandcell.backends.namespaces import NamespacesBackend

            backend = NamespacesBackend()
        self.backend: Backend = backend
        self.audit = audit or AuditLog(base / "audit.sqlite3")
        self.store = store or ArtifactStore(base / "artifacts")
        self.export_limits = export_limits or ExportLimits()

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.backend.close()
        self.audit.close()

    async def run_async(self, request: RunRequest) -> RunResult:
        """:meth:`run` for asyncio: the sandbox is supervised on a worker thread."""
        import asyncio  # only asyncio callers pay for importing it

        return await asyncio.to_thread(self.run, request)

    def run(self, request: RunRequest) -> RunResult:
        """Run one program in a fresh sandbox. Outcomes are results; only misuse raises."""
        globs = validate_globs(request.exports)
        inputs = inspect_inputs(request.inputs)
        run_id = uuid.uuid4().hex
        started_at = _now()

        def collect(ws: Path) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
            if not globs:
                return (), ()
            return collect_exports(ws, globs, self.store, self.export_limits)

        try:
            br = self.backend.run(request, run_id=run_id, collect=collect)
        except InfraError as exc:
            br = _infra_result(str(exc))
        result = RunResult(
            run_id=run_id,
            outcome=br.outcome,
            exit_code=br.exit_code,
            signal=br.signal,
            stdout=br.stdout.decode("utf-8", errors="replace"),
            stderr=br.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=br.stdout_truncated,
            stderr_truncated=br.stderr_truncated,
            usage=br.usage,
            artifacts=br.artifacts,
            rejected_exports=br.rejected_exports,
            enforcement=br.enforcement,
            reason=br.reason,
            started_at=started_at,
        )
        self.audit.append(self._record(request, result, br, inputs))
        return result

    def _record(
        self,
        request: RunRequest,
        result: RunResult,
        br: BackendResult,
        inputs: list[dict[str, object]],
    ) -> Mapping[str, object]:
        runtime = runtime_for(request.language)
        enforcement = result.enforcement
        return {
            "run_id": result.run_id,
            "started_at": result.started_at,
            "finished_at": _now(),
            "code": request.code,
            "code_sha256": _sha256(request.code.encode()),
            "language": request.language,
            "runtime": {
                "name": runtime.name,
                "identity": runtime.identity,
                "sha256": runtime.sha256,
            },
            "backend": {"name": self.backend.name, **self.backend.versions()},
            "host": {"kernel": platform.release(), "machine": platform.machine()},
            "limits": asdict(request.limits),
            "mode": request.mode.value,
            "env_names": sorted(request.env),
            "inputs": inputs,
            "stdin_sha256": _sha256(request.stdin),
            "exports": list(request.exports),
            "outcome": result.outcome.value,
            "reason": result.reason,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "usage": asdict(result.usage),
            "stdout_sha256": _sha256(br.stdout),
            "stderr_sha256": _sha256(br.stderr),
            "stdout": result.stdout,
            "stderr": result.stderr,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
            "artifacts": [asdict(a) for a in result.artifacts],
            "rejected_exports": [asdict(r) for r in result.rejected_exports],
            "enforcement": None
            if enforcement is None
            else {
                "backend": enforcement.backend,
                "mode": enforcement.mode.value,
                "layers": dict(enforcement.layers),
                "weakened": list(enforcement.weakened),
            },
        }


def _infra_result(reason: str) -> BackendResult:
    from sandcell.spec import Enforcement, IsolationMode

    return BackendResult(
        outcome=Outcome.INFRA_ERROR,
        exit_code=None,
        signal=None,
        stdout=b"",
        stderr=b"",
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=Enforcement(backend="none", layers={}, mode=IsolationMode.STRICT),
        reason=reason,
    )
