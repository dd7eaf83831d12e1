"""The provider-neutral model interface the agent talks to.

A model takes a list of chat messages and returns one completion of text, with the tokens it
used. That is all the agent needs: the protocol between agent and model (code blocks, the final
answer) is plain text, so every chat API, local servers included, can serve it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    role: Role
    content: str


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
    """Why the model stopped (``stop``, ``length``, ``end_turn``, ``max_tokens``...)."""


@runtime_checkable
class Model(Protocol):
    """Anything that completes a conversation. ``name`` is ``provider:model`` for the record."""

    name: str

    def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float | None = None
    ) -> Completion: ...


__all__ = ["Completion", "Message", "Model", "Role", "TokenUsage"]
