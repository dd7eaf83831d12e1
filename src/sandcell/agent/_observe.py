"""Reading a run's result for the agent: the attempt it records, the approval it went through,
the text its figures may be traced to, and the files it handed back; and a result read back from
its run record (an approved run, which ``sandcell approve`` ran while the agent was stopped)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping

from sandcell.agent.protocol import CodeBlock
from sandcell.agent.transcript import Attempt
from sandcell.errors import ConfigError
from sandcell.spec import (
    Artifact,
    DisplayOutput,
    Outcome,
    RejectedExport,
    RunResult,
    Usage,
)


def approval_of(result: RunResult) -> Mapping[str, object]:
    """The approval part of the result's policy record (empty when none was needed)."""
    approval = (result.policy or {}).get("approval")
    return approval if isinstance(approval, Mapping) else {}


def attempt_of(index: int, step: int, block: CodeBlock, result: RunResult) -> Attempt:
    """The attempt a run of ``block`` records."""
    approval = approval_of(result)
    # A waiting run's record says "id"; a decided one "approval_id".
    approval_id = approval.get("id") or approval.get("approval_id")
    findings = (result.policy or {}).get("findings")
    errors = (result.validation or {}).get("errors")
    return Attempt(
        index=index,
        step=step,
        language=block.language,
        code=block.code,
        run_id=result.run_id,
        outcome=result.outcome.value,
        reason=result.reason,
        stdout=result.stdout,
        stderr=result.stderr,
        wall_ms=result.usage.wall_ms,
        findings=tuple(f for f in findings if isinstance(f, Mapping))
        if isinstance(findings, list)
        else (),
        validation_errors=tuple(str(e) for e in errors) if isinstance(errors, list) else (),
        artifacts=result.artifacts,
        outputs=len(result.outputs),
        approval_id=str(approval_id) if approval_id else None,
    )


def evidence_texts(result: RunResult) -> list[str]:
    """Where a successful run's figures may be read: stdout, displayed values, the result."""
    texts = [result.stdout]
    texts += [o.data["text/plain"] for o in result.outputs if "text/plain" in o.data]
    value = (result.validation or {}).get("value")
    if value is not None:
        # A pydantic instance does not dump: its numbers are in stdout or the result file.
        with contextlib.suppress(TypeError, ValueError):
            texts.append(json.dumps(value))
    return texts


def exported(attempts: Iterable[Attempt]) -> tuple[Artifact, ...]:
    """The files successful attempts exported; a later attempt's file wins over an earlier one's."""
    by_path: dict[str, Artifact] = {}
    for attempt in attempts:
        if attempt.ok:
            for a in attempt.artifacts:
                by_path[a.path] = a
    return tuple(by_path.values())


def result_from_record(record: Mapping[str, object]) -> RunResult:
    """The result of a run, rebuilt from its record in the audit log.

    The record holds what the agent reads (outcome, reason, the redacted and capped stdout and
    stderr, displayed values, the declared result, artifacts); the enforcement report is left
    out. Raises ConfigError for a record that is not a run record.
    """
    try:
        usage = record.get("usage") or {}
        assert isinstance(usage, Mapping)
        return RunResult(
            run_id=str(record["run_id"]),
            outcome=Outcome(str(record["outcome"])),
            exit_code=_int_or_none(record.get("exit_code")),
            signal=_int_or_none(record.get("signal")),
            stdout=str(record.get("stdout") or ""),
            stderr=str(record.get("stderr") or ""),
            stdout_truncated=bool(record.get("stdout_truncated")),
            stderr_truncated=bool(record.get("stderr_truncated")),
            usage=Usage(
                wall_ms=float(usage.get("wall_ms") or 0.0),
                cpu_ms=usage.get("cpu_ms"),
                peak_memory_bytes=usage.get("peak_memory_bytes"),
            ),
            artifacts=_artifacts(record.get("artifacts")),
            rejected_exports=tuple(
                RejectedExport(path=str(r["path"]), reason=str(r["reason"]))
                for r in _dicts(record.get("rejected_exports"))
            ),
            enforcement=None,
            reason=str(record.get("reason") or ""),
            started_at=str(record.get("started_at") or ""),
            policy=_mapping(record.get("policy")),
            validation=_mapping(record.get("validation")),
            leaks=tuple(_dicts(record.get("leaks"))),
            outputs=tuple(_output(o) for o in _dicts(record.get("outputs"))),
        )
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        raise ConfigError(f"the run record is not one the agent can read ({exc!r})") from exc


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, object] | None:
    return value if isinstance(value, Mapping) else None


def _output(o: Mapping[str, object]) -> DisplayOutput:
    kind = o["kind"]
    if kind not in ("value", "table", "figure"):
        raise ValueError(f"unknown output kind {kind!r}")
    data = o.get("data")
    return DisplayOutput(
        kind=kind,
        data={str(k): str(v) for k, v in data.items()} if isinstance(data, Mapping) else {},
        artifacts=_artifacts(o.get("artifacts")),
    )


def _dicts(value: object) -> list[Mapping[str, object]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _artifacts(value: object) -> tuple[Artifact, ...]:
    return tuple(
        Artifact(
            path=str(a["path"]),
            sha256=str(a["sha256"]),
            size=int(a["size"]),  # type: ignore[call-overload]
            media_type=str(a["media_type"]),
        )
        for a in _dicts(value)
    )
