"""What the agent hands back: the answer, every attempt behind it, and what happened on the way.

:class:`Answer` is the whole transcript of one question. When the agent could not get a
trustworthy result it still returns one, with ``stop_reason`` saying why and no explanation: a
stop reason instead of a made-up answer. :func:`answer_to_dict` is the ``--json`` form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sandcell.models.base import TokenUsage
from sandcell.spec import Artifact, Language, artifact_to_dict

__all__ = [
    "STOP_REASONS",
    "Answer",
    "Attempt",
    "Event",
    "EventKind",
    "Figure",
    "StopReason",
    "answer_attempt_dict",
    "answer_to_dict",
]

StopReason = Literal[
    "answered",
    "retries_exhausted",
    "budget_steps",
    "budget_tokens",
    "budget_sandbox_time",
    "denied",
    "approval_denied",
    "awaiting_approval",
    "model_error",
    "untraceable_answer",
]
STOP_REASONS: tuple[StopReason, ...] = (
    "answered",
    "retries_exhausted",
    "budget_steps",
    "budget_tokens",
    "budget_sandbox_time",
    "denied",
    "approval_denied",
    "awaiting_approval",
    "model_error",
    "untraceable_answer",
)
"""Every way a question ends; only ``answered`` carries an explanation."""

EventKind = Literal[
    "planning", "plan", "running", "ran", "retrying", "fallback", "approval", "rejected", "stopped"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One step of the loop as it happens (the ``on_event`` callback gets each one)."""

    kind: EventKind
    step: int
    """The model turn this event belongs to (1-based)."""
    message: str
    """One line for a person watching the progress."""
    attempt: int | None = None
    """The attempt (1-based) this event is about, if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One program the model wrote, and what became of it in the sandbox."""

    index: int
    """1-based; the model refers to a run by this number or by its run id."""
    step: int
    language: Language
    code: str
    run_id: str | None
    """The run record (``sandcell audit show RUN_ID``); None when the code never reached the
    executor (a language the profile does not run)."""
    outcome: str
    """The run's outcome (``ok``, ``error``, ``timeout``, ``denied``...)."""
    reason: str = ""
    stdout: str = ""
    stderr: str = ""
    wall_ms: float = 0.0
    findings: tuple[Mapping[str, object], ...] = ()
    """The policy's findings on the code (rule id, severity, line, message)."""
    validation_errors: tuple[str, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    outputs: int = 0
    """How many rich outputs (values, tables, figures) the run displayed."""
    approval_id: str | None = None
    feedback: str = ""
    """What the agent told the model about this attempt, when it was not a success."""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """A computed figure of the answer, with the run whose output it was traced to."""

    name: str
    value: float | str
    """The number as the model stated it (a float), or a text value such as a date."""
    shown: str
    """The value exactly as written in the answer (``0.0720``, ``7.2%``)."""
    unit: str = ""
    run_id: str | None = None
    """The run the figure was found in (``sandcell audit show RUN_ID``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """The outcome of one question: an explanation with its evidence, or a stop reason."""

    question: str
    stop_reason: StopReason
    message: str
    """One sentence on how it ended (why it stopped, or that it was answered)."""
    explanation: str | None = None
    """The model's explanation; only for ``answered``, and only with numbers traced to runs."""
    figures: tuple[Figure, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    events: tuple[Event, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    """Files the successful runs exported (a later run's file wins over an earlier one's)."""
    model: str = ""
    profile: str = ""
    steps: int = 0
    tokens: TokenUsage = field(default_factory=TokenUsage)
    sandbox_s: float = 0.0
    """Wall time spent in sandboxes, all attempts together."""
    approval_id: str | None = None
    """The waiting run, for ``awaiting_approval``: decide it with ``sandcell approve ID``."""

    @property
    def answered(self) -> bool:
        return self.stop_reason == "answered"

    @property
    def run_ids(self) -> tuple[str, ...]:
        """Every run record of the question, in order."""
        return tuple(a.run_id for a in self.attempts if a.run_id is not None)


def answer_attempt_dict(a: Attempt) -> dict[str, object]:
    """The JSON form of one attempt (as in :func:`answer_to_dict`)."""
    return {
        "index": a.index,
        "step": a.step,
        "language": a.language,
        "code": a.code,
        "run_id": a.run_id,
        "outcome": a.outcome,
        "reason": a.reason,
        "stdout": a.stdout,
        "stderr": a.stderr,
        "wall_ms": a.wall_ms,
        "findings": [dict(f) for f in a.findings],
        "validation_errors": list(a.validation_errors),
        "artifacts": [artifact_to_dict(x) for x in a.artifacts],
        "outputs": a.outputs,
        "approval_id": a.approval_id,
        "feedback": a.feedback,
    }


def answer_to_dict(answer: Answer) -> dict[str, object]:
    """The JSON form of the whole transcript (``sandcell ask --json``)."""
    return {
        "question": answer.question,
        "stop_reason": answer.stop_reason,
        "answered": answer.answered,
        "message": answer.message,
        "explanation": answer.explanation,
        "figures": [
            {"name": f.name, "value": f.value, "shown": f.shown, "unit": f.unit, "run_id": f.run_id}
            for f in answer.figures
        ],
        "run_ids": list(answer.run_ids),
        "attempts": [answer_attempt_dict(a) for a in answer.attempts],
        "artifacts": [artifact_to_dict(x) for x in answer.artifacts],
        "events": [
            {"kind": e.kind, "step": e.step, "attempt": e.attempt, "message": e.message}
            for e in answer.events
        ],
        "model": answer.model,
        "profile": answer.profile,
        "usage": {
            "steps": answer.steps,
            "input_tokens": answer.tokens.input_tokens,
            "output_tokens": answer.tokens.output_tokens,
            "sandbox_s": round(answer.sandbox_s, 3),
        },
        "approval_id": answer.approval_id,
    }
