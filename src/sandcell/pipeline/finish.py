"""The last step of every run and session cell: validate the declared result, scan the output
and the exported files for leaked secrets, write the record, return the typed result.

:func:`finish` takes what a sandbox returned; :func:`not_run` records a run that never started
(denied, waiting for approval, an approval denied). Both append exactly one record to the audit
log (built by :func:`sandcell.audit.record.run_record`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

from sandcell.artifacts.store import ArtifactStore
from sandcell.audit import AuditLog
from sandcell.audit.record import run_record, utc_now
from sandcell.backends.base import Backend, BackendResult
from sandcell.inputs import inspect_inputs
from sandcell.packages.wheel_cache import WheelCache
from sandcell.pipeline.validators import Validators, missing_result, result_bytes
from sandcell.replay.evidence import declared_record
from sandcell.runtimes import runtime_for
from sandcell.runtimes.ref import runtime_ref
from sandcell.spec import Outcome, RunRequest, RunResult, Usage
from sandcell.validation import Leak, scan_artifact, validate_output


class Books(Protocol):
    """Where a run's results and record are kept, and the secrets its output must not show:
    the executor's stores."""

    @property
    def audit(self) -> AuditLog: ...

    @property
    def store(self) -> ArtifactStore: ...

    @property
    def wheels(self) -> WheelCache: ...

    @property
    def known_secrets(self) -> Sequence[str]: ...


def finish(
    books: Books,
    request: RunRequest,
    br: BackendResult,
    validators: Validators,
    policy: Mapping[str, object],
    *,
    backend: Backend,
    run_id: str,
    started_at: str,
    inputs: list[dict[str, object]],
    session_id: str | None = None,
    outside: Mapping[str, object] | None = None,
    secrets: Sequence[str] = (),
    record_extra: Mapping[str, object] | None = None,
) -> RunResult:
    """What happens after a sandbox ran ``request`` on ``backend`` and returned ``br``.

    ``outside``: what the run's egress proxy, tool gateway and (a session's) ingress gate saw
    (:meth:`RunSockets.take_record <sandcell.run_sockets.RunSockets.take_record>`); ``secrets``:
    the gateway's credentials, looked for in every output like the host's own;
    ``record_extra``: fields added to the record (never replacing one written here)."""
    known_secrets = (*books.known_secrets, *secrets)
    stdout = br.stdout.decode("utf-8", errors="replace")
    stderr = br.stderr.decode("utf-8", errors="replace")
    outcome, reason = br.outcome, br.reason
    validation: dict[str, object] | None = None
    report = validate_output(
        stdout=stdout,
        stderr=stderr,
        result_file=result_bytes(books.store, br.artifacts, validators.result_file),
        schema=validators.schema,
        model=validators.model,
        invariants=validators.invariants,
        known_secrets=known_secrets,
    )
    leaks = [_leak_dict(leak) for leak in report.leaks]
    for artifact in br.artifacts:
        data = books.store.path_for(artifact.sha256).read_bytes()
        found = scan_artifact(data, path=artifact.path, known_secrets=known_secrets)
        leaks += [_leak_dict(leak) for leak in found]
    if validators.declared and outcome is Outcome.OK:
        missing = missing_result(br, validators.result_file)
        valid = report.valid and missing is None
        errors = [missing] if missing is not None else list(report.errors)
        validation = {
            "valid": valid,
            "errors": errors,
            "value": report.value if valid else None,
        }
        if not valid:
            outcome = Outcome.INVALID_OUTPUT
            reason = "the declared result failed validation: " + "; ".join(errors[:3])
    runtime = runtime_for(request.language, request.runtime)
    result = RunResult(
        run_id=run_id,
        outcome=outcome,
        exit_code=br.exit_code,
        signal=br.signal,
        stdout=report.stdout,
        stderr=report.stderr,
        stdout_truncated=br.stdout_truncated,
        stderr_truncated=br.stderr_truncated,
        usage=br.usage,
        artifacts=br.artifacts,
        rejected_exports=br.rejected_exports,
        enforcement=br.enforcement,
        reason=reason,
        started_at=started_at,
        policy=policy,
        validation=validation,
        leaks=tuple(leaks),
        outputs=br.outputs,
        start=br.start,
        session_id=session_id,
        network=_mapping(outside, "network"),
        tools=_mapping(outside, "tools"),
        runtime=runtime_ref(runtime, request.runtime),
    )
    record = run_record(
        request,
        result,
        br,
        inputs,
        backend,
        runtime=runtime,
        store=books.store,
        wheels=books.wheels,
    )
    books.audit.append(
        {
            # First, so that no extra field can replace one the executor wrote.
            **(record_extra or {}),
            **record,
            "network": result.network,
            "tools": result.tools,
            # A session's port connections from outside (sessions/ports.py), where it has ports.
            **({"ingress": outside["ingress"]} if outside and outside.get("ingress") else {}),
            "declared": declared_record(
                schema=validators.schema,
                model=validators.model,
                invariants=validators.invariants,
                result_file=validators.result_file,
            ),
        }
    )
    return result


def not_run(
    books: Books,
    request: RunRequest,
    outcome: Outcome,
    reason: str,
    *,
    policy: Mapping[str, object],
    backend: Backend,
    record_extra: Mapping[str, object] | None = None,
) -> RunResult:
    """Record ``request`` as a run on ``backend`` that did not start (``outcome``, ``reason``),
    under a fresh run id, and return its result."""
    runtime = runtime_for(request.language, request.runtime)
    result = RunResult(
        run_id=uuid.uuid4().hex,
        outcome=outcome,
        exit_code=None,
        signal=None,
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
        usage=Usage(wall_ms=0.0, cpu_ms=None, peak_memory_bytes=None),
        artifacts=(),
        rejected_exports=(),
        enforcement=None,
        reason=reason,
        started_at=utc_now(),
        policy=policy,
        runtime=runtime_ref(runtime, request.runtime),
    )
    record = run_record(
        request,
        result,
        None,
        inspect_inputs(request.inputs),
        backend,
        runtime=runtime,
        store=books.store,
        wheels=books.wheels,
    )
    books.audit.append({**(record_extra or {}), **record})
    return result


def _leak_dict(leak: Leak) -> dict[str, object]:
    return {
        "kind": leak.kind,
        "severity": leak.severity,
        "stream": leak.stream,
        "line": leak.line,
        "preview": leak.preview,
    }


def _mapping(record: Mapping[str, object] | None, key: str) -> Mapping[str, object] | None:
    value = None if record is None else record.get(key)
    return value if isinstance(value, Mapping) else None
