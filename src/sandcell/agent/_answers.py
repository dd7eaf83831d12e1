"""Whether a final answer may be handed back: every number it states must come out of a run.

Two forms are checked: the answer proper (the ``answer`` block or tool, with its figures), and a
final answer the model wrote as plain prose after a successful run. Prose is accepted as the
explanation when it states at least one number a run printed and every number it states traces
to a run; prose that announces more work ("let me...", "I will...") is a plan, not an answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandcell.agent import feedback
from sandcell.agent._task import Task
from sandcell.agent.protocol import FinalAnswer
from sandcell.agent.trace import Evidence, trace_answer, trace_prose
from sandcell.agent.transcript import Figure

__all__ = ["Accepted", "Refused", "check_answer", "check_prose", "resolve_run"]

# Words of a model that is still working, not answering: its prose is a plan.
_STILL_WORKING = re.compile(
    r"\b(let me|let's|i will|i'll|i need to|i am going to|i'm going to|next,? i)\b", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Accepted:
    explanation: str
    figures: tuple[Figure, ...]
    prose: bool = False
    """The answer was written as prose (no answer block or tool call)."""


@dataclass(frozen=True, slots=True)
class Refused:
    kind: str
    """``untraceable`` or ``format``: how the loop counts the failure."""
    message: str
    """What the model is told."""


def _evidence(task: Task) -> Evidence:
    return Evidence(
        task.evidence, context="\n".join([task.question, *(i.name for i in task.inputs)])
    )


def check_answer(task: Task, answer: FinalAnswer) -> Accepted | Refused:
    """The answer proper: it must rest on runs, and every number trace to one."""
    if not task.evidence:
        return Refused("format", feedback.before_any_run())
    report = trace_answer(answer, _evidence(task), resolve_run=lambda ref: resolve_run(task, ref))
    if not report.ok:
        return Refused("untraceable", feedback.answer_rejected(report.untraced))
    figures = tuple(
        Figure(
            name=f.name,
            value=float(f.number) if f.number is not None else f.shown,
            shown=f.shown,
            unit=f.unit,
            run_id=run_id,
        )
        for f, run_id in zip(answer.figures, report.figure_runs, strict=True)
    )
    return Accepted(answer.explanation, figures)


def check_prose(task: Task, text: str, *, problem: str) -> Accepted | Refused:
    """A reply with neither code nor an answer, after a successful run: a prose answer?

    ``problem`` is what the model is told when the prose is no answer at all.
    """
    not_an_answer = Refused("format", feedback.unusable_reply(problem))
    if not task.evidence or _STILL_WORKING.search(text) or text.rstrip().endswith(":"):
        return not_an_answer
    from_runs, untraced = trace_prose(text, _evidence(task))
    if untraced:
        return Refused(
            "untraceable", feedback.prose_rejected(untraced, native=task.protocol == "native")
        )
    if from_runs == 0:
        return not_an_answer
    return Accepted(text.strip(), (), prose=True)


def resolve_run(task: Task, ref: str) -> str | None:
    """A figure's run reference (attempt number, run id or a prefix of one) to a run id."""
    ref = ref.strip().lstrip("#")
    if ref.isdigit():
        n = int(ref)
        if 1 <= n <= len(task.attempts):
            rid = task.attempts[n - 1].run_id
            return rid if rid in task.evidence else None
        return None
    matches = [rid for rid in task.evidence if len(ref) >= 6 and rid.startswith(ref)]
    return matches[0] if len(matches) == 1 else None
