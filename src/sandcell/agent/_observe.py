"""Reading a run's result for the agent: the attempt it records, the approval it went through,
the text its figures may be traced to, and the files it handed back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping

from sandcell.agent.protocol import CodeBlock
from sandcell.agent.transcript import Attempt
from sandcell.spec import Artifact, RunResult


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
