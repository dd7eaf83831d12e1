"""The provider-neutral model interface the agent talks to.

A model takes a list of chat messages and returns one completion: text, the tokens it used, and,
for a model that supports native tool calling, the tool calls it made. Two ways of talking to a
model share this interface:

* the plain-text protocol (code and the final answer in fenced blocks), which every chat API and
  every local server can serve;
* native tool calling (OpenAI-style ``tools``, Anthropic tool use), which models follow more
  reliably. A model offers it through its ``tool_calling`` attribute (:data:`ToolCalling`), and
  is then called with ``tools``; a model without the attribute is never sent tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, cast, runtime_checkable

from sandcell.errors import ModelError

Role = Literal["system", "user", "assistant", "tool"]

ToolCalling = Literal["auto", "native", "text"]
"""How a model is asked for code: ``native`` sends tools and fails if the server refuses them;
``auto`` sends tools and falls back to the plain-text protocol when the server rejects them (an
HTTP 400 naming tools); ``text`` never sends tools."""
TOOL_CALLING_MODES: tuple[ToolCalling, ...] = ("auto", "native", "text")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One call of a tool, as the model made it."""

    id: str
    """The provider's id of the call; the tool's result answers it by this id."""
    name: str
    arguments: str
    """The arguments as the JSON text the model wrote (kept as text: a number keeps the
    precision it was written with)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool offered to the model: a name, what it does, and the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """For ``assistant``: the tool calls of this turn (native tool calling)."""
    tool_call_id: str | None = None
    """For ``tool``: the call this message is the result of."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    text: str
    usage: TokenUsage
    model: str
    """The model that answered, as the provider names it."""
    finish_reason: str | None = None
    """Why the model stopped (``stop``, ``length``, ``end_turn``, ``tool_calls``...)."""
    tool_calls: tuple[ToolCall, ...] = field(default=())
    """The tools the model called, in order (native tool calling only)."""


@runtime_checkable
class Model(Protocol):
    """Anything that completes a conversation. ``name`` is ``provider:model`` for the record."""

    name: str

    def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float | None = None
    ) -> Completion: ...


class ToolModel(Protocol):
    """A model that can also be offered tools (it has a ``tool_calling`` attribute)."""

    name: str
    tool_calling: ToolCalling

    def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> Completion: ...


class ToolsUnsupported(ModelError):
    """The server refused a request because it carried tools (it has no tool calling).

    Raised only by a model whose ``tool_calling`` is ``auto``; the model has already switched
    itself to ``text``, and the caller repeats the turn with the plain-text protocol.
    """

    def __init__(self, message: str, *, status: int | None = 400) -> None:
        super().__init__(message, status=status, retryable=False)


def tool_calling_of(model: Model) -> ToolCalling:
    """How ``model`` is to be asked: ``text`` for a model without the ``tool_calling`` attribute."""
    value = getattr(model, "tool_calling", "text")
    return cast(ToolCalling, value) if value in TOOL_CALLING_MODES else "text"


__all__ = [
    "TOOL_CALLING_MODES",
    "Completion",
    "Message",
    "Model",
    "Role",
    "TokenUsage",
    "ToolCall",
    "ToolCalling",
    "ToolModel",
    "ToolSpec",
    "ToolsUnsupported",
    "tool_calling_of",
]
