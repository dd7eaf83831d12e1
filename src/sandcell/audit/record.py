"""The record of one run: the mapping the audit log keeps for it (see :mod:`sandcell.audit`).

Built from the request, its typed result and what the backend returned; the fields that let a
replay reproduce the run (``record_version``, ``stdin_kept``, ``packages``) are described in
:mod:`sandcell.replay.evidence`. A run that never started (denied, waiting for approval) has a
record too, with the hashes of empty output.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
from collections.abc import Mapping

from sandcell.artifacts.store import ArtifactStore
from sandcell.backends.base import Backend, BackendResult
from sandcell.packages.wheel_cache import WheelCache
from sandcell.replay.evidence import RECORD_VERSION, keep_stdin, packages_record
from sandcell.runtimes import Runtime
from sandcell.runtimes.ref import runtime_record
from sandcell.spec import (
    Artifact,
    Limits,
    RejectedExport,
    RunRequest,
    RunResult,
    Usage,
    output_to_dict,
    start_to_dict,
)


def _flat(value: Limits | Usage | Artifact | RejectedExport) -> dict[str, object]:
    """The fields of a dataclass whose values are all plain (str, numbers, None): what
    ``dataclasses.asdict`` gives, without its recursive deep copy (two thirds of this module's
    CPU per run: bench/PROFILE.md)."""
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def utc_now() -> str:
    """The time as a record keeps it (``started_at``, ``finished_at``): UTC, ISO 8601, µs."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_record(
    request: RunRequest,
    result: RunResult,
    br: BackendResult | None,
    inputs: list[dict[str, object]],
    backend: Backend,
    *,
    runtime: Runtime,
    store: ArtifactStore,
    wheels: WheelCache,
) -> dict[str, object]:
    """The record of ``request``'s run, whose ``result`` is final; ``br`` is None for a run that
    never started. Keeps the stdin bytes in ``store`` (for a replay) as a side effect."""
    enforcement = result.enforcement
    return {
        "run_id": result.run_id,
        "started_at": result.started_at,
        "finished_at": utc_now(),
        "code": request.code,
        "code_sha256": _sha256(request.code.encode()),
        "language": request.language,
        "runtime": runtime_record(runtime, request.runtime),
        "backend": {"name": backend.name, **backend.versions()},
        "host": {"kernel": platform.release(), "machine": platform.machine()},
        "limits": _flat(request.effective_limits),
        "mode": request.mode.value,
        "env_names": sorted(request.env),
        "inputs": inputs,
        "stdin_sha256": _sha256(request.stdin),
        "exports": list(request.exports),
        "display": request.display,
        "outcome": result.outcome.value,
        "reason": result.reason,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "usage": _flat(result.usage),
        "stdout_sha256": _sha256(br.stdout if br else b""),
        "stderr_sha256": _sha256(br.stderr if br else b""),
        "stdout": result.stdout,
        "stderr": result.stderr,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "artifacts": [_flat(a) for a in result.artifacts],
        "rejected_exports": [_flat(r) for r in result.rejected_exports],
        "policy": None if result.policy is None else dict(result.policy),
        "validation": validation_record(result.validation),
        "leaks": list(result.leaks),
        "outputs": [output_to_dict(o) for o in result.outputs],
        "start": start_to_dict(result.start),
        "session_id": result.session_id,
        "record_version": RECORD_VERSION,
        "stdin_kept": keep_stdin(store, request.stdin),
        "packages": packages_record(request.packages, wheels),
        "landlock": request.landlock,
        "enforcement": None
        if enforcement is None
        else {
            "backend": enforcement.backend,
            "mode": enforcement.mode.value,
            "layers": dict(enforcement.layers),
            "weakened": list(enforcement.weakened),
        },
    }


def validation_record(validation: Mapping[str, object] | None) -> dict[str, object] | None:
    """The validation as the run record keeps it: a pydantic model's value in its JSON form
    (the result keeps the model instance for the caller)."""
    if validation is None:
        return None
    value = validation.get("value")
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return {**validation, "value": dump(mode="json")}
    return dict(validation)
