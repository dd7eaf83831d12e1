"""Models that need no provider: scripted turns and a plain function.

They ship in the package because the agent's tests and examples run without any network, and
because a user can replay a recorded conversation through the real sandbox with them.

A turn is a text reply, or a :class:`Scripted` reply with tool calls (native tool calling):

>>> ScriptedModel([Scripted(tool_calls=(call("run_code", code="print(6*7)"),))])  # doctest: +SKIP

A script file (``--model scripted:FILE``) is a JSON list whose items are strings or objects
``{"text": "...", "tool_calls": [{"name": "run_code", "arguments": {"code": "..."}}]}``
(:func:`turns_from_json`). Running out of turns raises a :class:`~sandcell.errors.ModelError`,
which the agent reports as a ``model_error`` stop like any other failure of a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sandcell.errors import ConfigError, ModelError
from sandcell.models.base import Completion, Message, TokenUsage, ToolCall, ToolCalling, ToolSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Scripted:
    """A scripted reply: text and the tool calls the model makes in the same turn."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


Reply = str | Scripted
Turn = Reply | Callable[[Sequence[Message]], Reply]
"""A scripted turn: a fixed reply, or a function of the conversation so far."""

_ids = iter(range(1, 1 << 62))


def call(name: str, arguments: Mapping[str, object] | None = None, **kw: object) -> ToolCall:
    """A tool call with fresh id, arguments given as a mapping or as keywords.

    A :class:`~decimal.Decimal` argument is written as it is (``6.60`` stays ``6.60``), as a
    provider passes on the digits the model wrote.
    """
    args = {**(arguments or {}), **kw}
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=_dumps(args))


def _dumps(value: object) -> str:
    # json cannot write a number from its text, so each Decimal goes out as a unique string
    # that is then replaced by the number's digits.
    digits: dict[str, str] = {}

    def swap(v: object) -> object:
        if isinstance(v, Decimal):
            key = f"\x00{len(digits)}\x00"
            digits[json.dumps(key)] = str(v)
            return key
        if isinstance(v, Mapping):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value))
    for key, number in digits.items():
        text = text.replace(key, number)
    return text


def turns_from_json(data: object, *, where: str) -> list[Turn]:
    """The turns of a script file's JSON (a list of strings and tool-call objects); read the
    file with ``parse_float=Decimal`` to keep each number's digits as written.

    Raises ConfigError naming ``where`` and the item that is not a turn.
    """
    if not isinstance(data, list):
        raise ConfigError(
            f'{where} must hold a JSON list of strings (["reply 1", ...]) or of reply objects'
        )
    turns: list[Turn] = []
    for i, item in enumerate(data, start=1):
        if isinstance(item, str):
            turns.append(item)
            continue
        problem = _scripted_problem(item)
        if problem is not None:
            raise ConfigError(
                f"{where}: reply {i} {problem}; write a string, or an object "
                '{"text": "...", "tool_calls": [{"name": "run_code", "arguments": {...}}]}'
            )
        assert isinstance(item, dict)
        calls = tuple(
            call(str(c["name"]), dict(c.get("arguments", {}))) for c in item.get("tool_calls", [])
        )
        turns.append(Scripted(text=str(item.get("text", "")), tool_calls=calls))
    return turns


def _scripted_problem(item: object) -> str | None:
    if not isinstance(item, dict):
        return "is neither a string nor an object"
    unknown = set(item) - {"text", "tool_calls"}
    if unknown:
        return f"has unknown keys {sorted(unknown)}"
    if not isinstance(item.get("text", ""), str):
        return "has a 'text' that is not a string"
    calls = item.get("tool_calls", [])
    if not isinstance(calls, list):
        return "has 'tool_calls' that is not a list"
    for c in calls:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            return "has a tool call without a 'name'"
        if not isinstance(c.get("arguments", {}), dict):
            return "has a tool call whose 'arguments' is not an object"
    return None


def _estimate_tokens(text: str) -> int:
    # About four characters a token, as the providers' own rules of thumb say; enough for budgets.
    return max(1, (len(text) + 3) // 4)


def _completion(messages: Sequence[Message], reply: Reply, name: str) -> Completion:
    text, calls = (reply, ()) if isinstance(reply, str) else (reply.text, reply.tool_calls)
    written = text + "".join(c.name + c.arguments for c in calls)
    return Completion(
        text=text,
        usage=TokenUsage(
            input_tokens=sum(_estimate_tokens(m.content) for m in messages),
            output_tokens=_estimate_tokens(written),
        ),
        model=name,
        finish_reason="tool_calls" if calls else "stop",
        tool_calls=calls,
    )


class ScriptedModel:
    """Answers with the given turns in order; running out of turns is a ModelError, not a loop.

    ``tool_calling`` is ``native`` when a fixed turn has tool calls, else ``text`` (pass it to
    say otherwise, e.g. for turns that are functions). ``skip(n)`` starts the script further on:
    a resumed conversation continues the script where it stopped.
    """

    def __init__(
        self,
        turns: Sequence[Turn],
        *,
        name: str = "fake:scripted",
        tool_calling: ToolCalling | None = None,
    ) -> None:
        self.name = name
        self._turns = list(turns)
        self._next = 0
        native = any(isinstance(t, Scripted) and t.tool_calls for t in self._turns)
        self.tool_calling: ToolCalling = tool_calling or ("native" if native else "text")
        self.calls: list[list[Message]] = []
        """Every conversation the model was asked to complete (for assertions)."""
        self.tools: list[tuple[ToolSpec, ...]] = []
        """The tools offered with each call (empty for a plain-text call)."""

    def skip(self, turns: int) -> None:
        """Start the script ``turns`` further on (the turns a paused conversation already had)."""
        self._next += max(0, turns)

    def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        self.calls.append(list(messages))
        self.tools.append(tuple(tools))
        if self._next >= len(self._turns):
            raise ModelError(
                f"the scripted model {self.name} has {len(self._turns)} turns and was asked for "
                f"turn {self._next + 1}; add turns to the script"
            )
        turn = self._turns[self._next]
        self._next += 1
        return _completion(messages, turn(messages) if callable(turn) else turn, self.name)


class FunctionModel:
    """Answers with ``fn(messages)``: a model written as Python, for tests and experiments."""

    def __init__(
        self,
        fn: Callable[[Sequence[Message]], Reply],
        *,
        name: str = "fake:function",
        tool_calling: ToolCalling = "text",
    ) -> None:
        self.name = name
        self._fn = fn
        self.tool_calling: ToolCalling = tool_calling
        self.calls: list[list[Message]] = []
        self.tools: list[tuple[ToolSpec, ...]] = []

    def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        self.calls.append(list(messages))
        self.tools.append(tuple(tools))
        return _completion(messages, self._fn(messages), self.name)


__all__ = ["FunctionModel", "Reply", "Scripted", "ScriptedModel", "Turn", "call", "turns_from_json"]
