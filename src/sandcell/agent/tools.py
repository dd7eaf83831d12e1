"""Native tool calling: the two tools the model is offered, and how its calls are read.

* ``run_code(code, language)`` runs a program in a fresh sandbox; its result (the run's output,
  or why it failed) goes back as the call's tool result (:func:`tools_for` says what the
  profile lets the program reach);
* ``answer(explanation, figures)`` is the final answer, the same JSON the plain-text protocol's
  ```` ```answer ```` block holds.

Calls are read into the same :class:`~sandcell.agent.protocol.Reply` as a plain-text reply, so
the loop does not care which protocol the model speaks. :func:`as_text` turns a conversation held
with tools into its plain-text form, for a server that turns out to have no tool calling.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from sandcell.agent.protocol import ANSWER_TAG, CodeBlock, Reply, parse_answer
from sandcell.models.base import Completion, Message, ToolCall, ToolSpec
from sandcell.spec import LANGUAGE_ALIASES, LANGUAGES, language_named

if TYPE_CHECKING:
    from sandcell.policy.profiles import Profile

__all__ = [
    "ANSWER",
    "NO_TOOL_CALL",
    "RUN_CODE",
    "TOOLS",
    "as_text",
    "read_tool_calls",
    "tools_for",
]


def _run_code_parameters(languages: Sequence[str]) -> dict[str, object]:
    return {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The whole program."},
            "language": {
                "type": "string",
                "enum": list(languages),
                "description": "The program's language (default python).",
            },
        },
        "required": ["code"],
        "additionalProperties": False,
    }


RUN_CODE = ToolSpec(
    name="run_code",
    description="Run one complete program in a fresh, isolated sandbox (no network; the inputs "
    "read-only under /inputs and in the working directory) and get back what it printed. "
    "Nothing carries over between runs. Print every figure you will report, with a label.",
    parameters=_run_code_parameters(LANGUAGES),
)
ANSWER = ToolSpec(
    name="answer",
    description="Give the final answer once the output of a successful run answers the "
    "question. Every number in it must appear in the printed output of a successful run.",
    parameters={
        "type": "object",
        "properties": {
            "explanation": {
                "type": "string",
                "description": "One or two plain sentences answering the question with the "
                "computed figures.",
            },
            "figures": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "value": {
                            "type": ["number", "string"],
                            "description": "A number, or a text value such as a date.",
                        },
                        "unit": {"type": "string"},
                        "run": {
                            "type": ["integer", "string"],
                            "description": "The number of the run whose output shows it.",
                        },
                    },
                    "required": ["name", "value"],
                },
            },
        },
        "required": ["explanation"],
        "additionalProperties": False,
    },
)
TOOLS: tuple[ToolSpec, ...] = (RUN_CODE, ANSWER)
"""The tools under a profile that reaches nothing outside the sandbox and runs every language."""


def tools_for(profile: Profile) -> tuple[ToolSpec, ...]:
    """The tools offered under ``profile``: ``run_code`` says what its programs may reach."""
    reach = []
    if profile.allows_network():
        reach.append("the network only through a proxy, to the hosts the rules list")
    if profile.tools:
        reach.append("the governed tools the rules list, through sandcell_tools.call")
    # A profile that runs no language keeps the full enum (an empty one is no schema); its
    # refusal says so when a program comes.
    languages = [lang for lang in LANGUAGES if profile.allows_language(lang)] or list(LANGUAGES)
    if not reach and languages == list(LANGUAGES):
        return TOOLS
    description = RUN_CODE.description.replace(
        "(no network;", f"(it may reach {' and '.join(reach)};" if reach else "(no network;"
    )
    # The language enum is what the profile runs: a model is not offered a language the
    # profile refuses (a call in one anyway is answered with the refusal).
    parameters = _run_code_parameters(languages)
    return (replace(RUN_CODE, description=description, parameters=parameters), ANSWER)


NO_TOOL_CALL = (
    "the reply called no tool: call run_code with a program to run, or answer with the final answer"
)


def read_tool_calls(completion: Completion) -> Reply:
    """The reply a completion with tool calls makes: the first ``run_code`` call, else the last
    ``answer``; every other call of the turn is answered as not run."""
    calls = completion.tool_calls
    plan = completion.text.strip()
    runs = [c for c in calls if c.name == RUN_CODE.name]
    answers = [c for c in calls if c.name == ANSWER.name]
    chosen = runs[0] if runs else answers[-1] if answers else calls[0]
    ignored = tuple(c.id for c in calls if c is not chosen)
    notes = []
    if len(runs) > 1:
        notes.append(f"only the first of your {len(runs)} run_code calls ran")
    if runs and answers:
        notes.append("the answer call was ignored: answer after you have seen the output")
    note = "; ".join(notes) + "; call one tool at a time" if notes else None
    reply = Reply(plan=plan, note=note, call_id=chosen.id, ignored_calls=ignored)
    if chosen.name == RUN_CODE.name:
        code, problem = _run_code(chosen)
        return replace(reply, code=code, problem=problem)
    if chosen.name == ANSWER.name:
        answer, problem = parse_answer(chosen.arguments)
        return replace(reply, answer=answer, problem=problem)
    return replace(reply, problem=f"there is no tool {chosen.name!r}: call run_code or answer")


def _run_code(call: ToolCall) -> tuple[CodeBlock | None, str | None]:
    try:
        args = json.loads(call.arguments)
    except ValueError as exc:
        return None, f"the arguments of run_code are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return None, "the arguments of run_code must be an object with 'code'"
    code, language = args.get("code"), args.get("language", "python")
    if not isinstance(code, str) or not code.strip():
        return None, "run_code needs the program in 'code'"
    if not isinstance(language, str) or language.strip().lower() not in LANGUAGE_ALIASES:
        return None, (
            f"run_code's 'language' must be one of {', '.join(LANGUAGES)}, not {language!r}"
        )
    text = code if code.endswith("\n") else code + "\n"
    return CodeBlock(language=language_named(language), code=text), None


def as_text(messages: Sequence[Message]) -> list[Message]:
    """The conversation with its tool calls written as fenced blocks and its tool results as
    user messages: what the plain-text protocol would have had."""
    out: list[Message] = []
    for m in messages:
        if m.role == "tool":
            out.append(Message(role="user", content=m.content))
        elif m.tool_calls:
            blocks = [_as_block(c) for c in m.tool_calls]
            text = "\n\n".join(part for part in (m.content.strip(), *blocks) if part)
            out.append(Message(role="assistant", content=text))
        else:
            out.append(m)
    return out


def _as_block(call: ToolCall) -> str:
    if call.name == RUN_CODE.name:
        code, _ = _run_code(call)
        if code is not None:
            return f"```{code.language}\n{code.code}```"
    if call.name == ANSWER.name:
        return f"```{ANSWER_TAG}\n{call.arguments}\n```"
    return f"(a call of {call.name} with {call.arguments})"
