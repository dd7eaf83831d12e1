"""The plain-text protocol between the agent and the model, and the reply both protocols read to.

Every reply of the model is one of two things, in a fenced block; text around the block is the
model's plan and is only shown, never run:

* code to run: a ```` ```python ```` (or ```` ```bash ````) block;
* the final answer: an ```` ```answer ```` block holding JSON::

      {"explanation": "The mean daily conversion rate was 7.2% ...",
       "figures": [{"name": "mean conversion rate", "value": 7.2, "unit": "%", "run": 2}]}

  ``run`` is the attempt number or the run id the figure came from (optional).

Plain text works with every chat API and every local server; it is the fallback where native
tool calling (:mod:`sandcell.agent.tools`, which reads tool calls into the same :class:`Reply`)
is not available. :func:`parse_reply` never raises: a reply that breaks the protocol comes back
with ``problem`` set, and the agent sends that sentence back to the model. A reply with neither
code nor an answer also keeps its text as ``prose``: after a successful run it may be a final
answer written as plain prose (the agent accepts it when its numbers trace to the runs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal

from sandcell.spec import LANGUAGE_ALIASES, Language

__all__ = [
    "ANSWER_TAG",
    "CodeBlock",
    "FigureClaim",
    "FinalAnswer",
    "Reply",
    "parse_answer",
    "parse_reply",
]

ANSWER_TAG = "answer"

_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[\w+.-]*)[^\n]*\n"
    r"(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
# A fence's tag: every name a language goes by (js, ts, sh...), and python3.
_LANGUAGES: dict[str, Language] = {**LANGUAGE_ALIASES, "python3": "python"}
_ANSWER_TAGS = {ANSWER_TAG, "final", "final_answer"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeBlock:
    language: Language
    code: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureClaim:
    """A figure as the model stated it, before it is traced to a run."""

    name: str
    shown: str
    """The value as written: the JSON number's own text (``0.0720`` keeps its precision), or
    the string the model gave."""
    number: Decimal | None
    """The value when it is a JSON number; None for a string value."""
    unit: str = ""
    run: str | None = None
    """The run it came from, as the model referred to it (an attempt number or a run id)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalAnswer:
    explanation: str
    figures: tuple[FigureClaim, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """One model reply, read."""

    plan: str
    """The text outside the blocks (the model's reasoning or plan)."""
    code: CodeBlock | None = None
    answer: FinalAnswer | None = None
    problem: str | None = None
    """Why the reply could not be used as it is, said to the model; None when it could."""
    note: str | None = None
    """Something to tell the model even though the reply was used (extra blocks ignored)."""
    prose: str | None = None
    """The whole text of a reply with neither code nor an answer: possibly a final answer
    written as prose."""
    call_id: str | None = None
    """Native tool calling: the call the agent's next message answers (its tool result)."""
    ignored_calls: tuple[str, ...] = ()
    """Native tool calling: further calls of the same turn, answered as not run."""


class _Number(str):
    """A JSON number kept as its text, so that ``0.0720`` keeps its four decimals."""


def parse_reply(text: str) -> Reply:
    """Read a model reply: the first code block to run, or the final answer, or a problem."""
    blocks = list(_FENCE.finditer(text))
    plan = _FENCE.sub("", text).strip()
    code_blocks: list[CodeBlock] = []
    answers: list[str] = []
    unknown: list[str] = []
    for m in blocks:
        tag = m.group("tag").lower()
        body = m.group("body")
        if tag in _LANGUAGES:
            code_blocks.append(CodeBlock(language=_LANGUAGES[tag], code=body))
        elif tag in _ANSWER_TAGS:
            answers.append(body)
        else:
            unknown.append(tag or "(untagged)")
    if code_blocks:
        extra = []
        if len(code_blocks) > 1:
            extra.append(f"only the first of your {len(code_blocks)} code blocks ran")
        if answers:
            # An answer written before the code's output was seen cannot be about that output.
            extra.append("the answer block was ignored: answer after you have seen the output")
        return Reply(
            plan=plan,
            code=code_blocks[0],
            note="; ".join(extra) + "; reply with one block at a time" if extra else None,
        )
    if answers:
        answer, problem = parse_answer(answers[-1])
        return Reply(plan=plan, answer=answer, problem=problem)
    prose = text.strip() or None
    if unknown:
        return Reply(
            plan=plan,
            problem=f"the reply has a block tagged {unknown[0]!r}, which is neither code nor an "
            "answer: tag code blocks ```python (or ```bash) and the final answer ```answer",
            prose=prose,
        )
    return Reply(
        plan=plan,
        problem="the reply has no code block and no answer block: reply with one ```python "
        "block to run, or with the final ```answer block",
        prose=prose,
    )


def parse_answer(body: str) -> tuple[FinalAnswer | None, str | None]:
    """The final answer from its JSON text, or the problem with it, said for the model."""
    try:
        data = json.loads(body, parse_float=_Number, parse_int=_Number)
    except ValueError as exc:
        return None, f"the answer block is not valid JSON ({exc}); write it as a JSON object"
    if not isinstance(data, dict):
        return None, "the answer block must be a JSON object with 'explanation' and 'figures'"
    explanation = data.get("explanation")
    if not isinstance(explanation, str) or not explanation.strip():
        return None, "the answer needs a non-empty 'explanation' string"
    raw_figures = data.get("figures", [])
    if not isinstance(raw_figures, list):
        return None, "'figures' must be a list of objects with 'name' and 'value'"
    figures: list[FigureClaim] = []
    for i, item in enumerate(raw_figures, start=1):
        figure, problem = _parse_figure(item, i)
        if problem is not None:
            return None, problem
        if figure is not None:
            figures.append(figure)
    return FinalAnswer(explanation=explanation.strip(), figures=tuple(figures)), None


def _parse_figure(item: object, i: int) -> tuple[FigureClaim | None, str | None]:
    if not isinstance(item, dict):
        return None, f"figure {i} must be an object with 'name' and 'value'"
    name, value = item.get("name"), item.get("value")
    if not isinstance(name, str) or not name.strip():
        return None, f"figure {i} needs a 'name' string"
    unit = item.get("unit", "")
    if not isinstance(unit, str):
        return None, f"figure {i}: 'unit' must be a string"
    run = item.get("run")
    if run is not None and not isinstance(run, str):
        return None, f"figure {i}: 'run' must be an attempt number or a run id"
    if isinstance(value, _Number):
        return FigureClaim(
            name=name.strip(), shown=str(value), number=Decimal(value), unit=unit, run=run
        ), None
    if isinstance(value, str) and value.strip():
        return FigureClaim(
            name=name.strip(), shown=value.strip(), number=None, unit=unit, run=run
        ), None
    return None, f"figure {i} ({name!r}) needs a 'value': a number, or a string such as a date"
