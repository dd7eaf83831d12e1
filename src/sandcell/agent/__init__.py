"""The code-execution agent: ask a question, get a computed, validated answer and its evidence.

>>> from sandcell.agent import Agent, Budget                     # doctest: +SKIP
>>> agent = Agent(executor, model, profile="analysis", budget=Budget(max_steps=6))  # doctest: +SKIP
>>> answer = agent.ask("Mean conversion rate per day?", inputs=["sales.csv"])  # doctest: +SKIP
>>> agent.resume(answer.approval_id)  # after awaiting_approval and a decision  # doctest: +SKIP

:func:`as_tool` wraps the same agent as a plain function with an OpenAI-style JSON schema, for
other agent frameworks to call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sandcell.agent.budget import Budget
from sandcell.agent.loop import Agent, EventCallback
from sandcell.agent.paused import ResumeError
from sandcell.agent.transcript import (
    STOP_REASONS,
    Answer,
    Attempt,
    Event,
    Figure,
    StopReason,
    answer_to_dict,
)

if TYPE_CHECKING:
    from sandcell.executor import ApprovalCallback, Executor
    from sandcell.models.base import Model
    from sandcell.policy.profiles import Profile

__all__ = [
    "STOP_REASONS",
    "Agent",
    "Answer",
    "Attempt",
    "Budget",
    "Event",
    "EventCallback",
    "Figure",
    "ResumeError",
    "StopReason",
    "answer_to_dict",
    "as_tool",
]

TOOL_NAME = "sandcell_ask"
TOOL_PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {
        "question": {
            "type": "string",
            "description": "The question to answer by computing, e.g. 'What is the mean daily "
            "conversion rate in sales.csv?'",
        },
        "inputs": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Paths of host files or directories the computation may read "
            "(read-only).",
            "default": [],
        },
    },
    "required": ["question"],
    "additionalProperties": False,
}


def as_tool(
    executor: Executor,
    model: Model,
    *,
    profile: Profile | str | None = None,
    budget: Budget | None = None,
    approve: ApprovalCallback | None = None,
) -> Callable[..., dict[str, object]]:
    """The agent as a plain function ``(question, inputs=[]) -> dict`` for other frameworks.

    The function has a ``__doc__``, a ``__name__`` and a ``parameters`` attribute holding the
    JSON Schema of its arguments (the OpenAI function-tool shape). It returns the whole
    transcript (:func:`answer_to_dict`); ``answered`` says whether to trust ``explanation``.
    Without ``approve``, a run that needs approval ends the call with ``awaiting_approval``.
    """
    agent = Agent(executor, model, profile=profile, budget=budget, approve=approve)

    def sandcell_ask(question: str, inputs: list[str] | None = None) -> dict[str, object]:
        return answer_to_dict(agent.ask(question, inputs=list(inputs or [])))

    sandcell_ask.__doc__ = (
        "Answer a question about data by writing and running code in an isolated sandbox (no "
        "network beyond what its profile allows). Returns the explanation, the computed "
        "figures with the run each came from, the code that ran and a stop_reason; 'answered' "
        "is false when no trustworthy result was found."
    )
    sandcell_ask.__name__ = TOOL_NAME
    sandcell_ask.parameters = TOOL_PARAMETERS  # type: ignore[attr-defined]
    return sandcell_ask
