"""Models that need no provider: scripted turns and a plain function.

They ship in the package because the agent's tests and examples run without any network, and
because a user can replay a recorded conversation through the real sandbox with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sandcell.errors import ConfigError
from sandcell.models.base import Completion, Message, TokenUsage

Turn = str | Callable[[Sequence[Message]], str]
"""A scripted turn: a fixed reply, or a function of the conversation so far."""


def _estimate_tokens(text: str) -> int:
    # About four characters a token, as the providers' own rules of thumb say; enough for budgets.
    return max(1, (len(text) + 3) // 4)


def _completion(messages: Sequence[Message], text: str, name: str) -> Completion:
    return Completion(
        text=text,
        usage=TokenUsage(
            input_tokens=sum(_estimate_tokens(m.content) for m in messages),
            output_tokens=_estimate_tokens(text),
        ),
        model=name,
        finish_reason="stop",
    )


class ScriptedModel:
    """Answers with the given turns in order; running out of turns is an error, not a loop."""

    def __init__(self, turns: Sequence[Turn], *, name: str = "fake:scripted") -> None:
        self.name = name
        self._turns = list(turns)
        self.calls: list[list[Message]] = []
        """Every conversation the model was asked to complete (for assertions)."""

    def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float | None = None
    ) -> Completion:
        self.calls.append(list(messages))
        if len(self.calls) > len(self._turns):
            raise ConfigError(
                f"the scripted model has {len(self._turns)} turns and was asked for turn "
                f"{len(self.calls)}; add turns to the script"
            )
        turn = self._turns[len(self.calls) - 1]
        text = turn(messages) if callable(turn) else turn
        return _completion(messages, text, self.name)


class FunctionModel:
    """Answers with ``fn(messages)``: a model written as Python, for tests and experiments."""

    def __init__(
        self, fn: Callable[[Sequence[Message]], str], *, name: str = "fake:function"
    ) -> None:
        self.name = name
        self._fn = fn
        self.calls: list[list[Message]] = []

    def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float | None = None
    ) -> Completion:
        self.calls.append(list(messages))
        return _completion(messages, self._fn(messages), self.name)


__all__ = ["FunctionModel", "ScriptedModel", "Turn"]
