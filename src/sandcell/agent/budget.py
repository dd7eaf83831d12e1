"""Budgets of one question: model turns, model tokens, and time in sandboxes.

Running out of any of them is a stop reason, never an error. The sandbox-time budget is a hard
bound: each run's wall-time limit is cut to what is left of it, so the last run cannot overrun it
by more than the kernel's reaction time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sandcell.agent.transcript import StopReason
from sandcell.errors import ConfigError
from sandcell.models.base import TokenUsage

__all__ = ["MIN_RUN_S", "Budget", "Spending"]

MIN_RUN_S = 0.5
"""A run is not started with less sandbox time than this left: it could not even start Python."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Limits of one question; each must be positive."""

    max_steps: int = 10
    """Model turns (each reply of the model is one step)."""
    max_tokens: int = 100_000
    """Model tokens, input and output together, over all turns."""
    max_sandbox_s: float = 300.0
    """Wall time in sandboxes, over all runs."""
    reply_tokens: int = 4_096
    """The most tokens one reply may have (``max_tokens`` of each model request)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"budget {f.name} must be a positive number, got {value!r}")


class Spending:
    """What one question has used so far (mutable: the loop's running tally)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.steps = 0
        self.tokens = TokenUsage()
        self.sandbox_s = 0.0

    def before_step(self) -> StopReason | None:
        """The stop reason if no further model turn may be taken."""
        if self.steps >= self.budget.max_steps:
            return "budget_steps"
        if self.tokens.total >= self.budget.max_tokens:
            return "budget_tokens"
        return None

    def reply_tokens(self) -> int:
        """``max_tokens`` for the next request: never more than is left of the budget."""
        return max(1, min(self.budget.reply_tokens, self.budget.max_tokens - self.tokens.total))

    def run_wall_s(self, wanted_s: float) -> float | None:
        """The wall-time limit of the next run, cut to the budget; None when too little is left."""
        left = self.budget.max_sandbox_s - self.sandbox_s
        if left < MIN_RUN_S:
            return None
        return min(wanted_s, left)

    def add_turn(self, usage: TokenUsage) -> None:
        self.steps += 1
        self.tokens = self.tokens + usage

    def add_run(self, wall_ms: float) -> None:
        self.sandbox_s += wall_ms / 1000.0

    def describe(self, reason: StopReason) -> str:
        b = self.budget
        match reason:
            case "budget_steps":
                return f"the step budget is spent ({self.steps} of {b.max_steps} model turns)"
            case "budget_tokens":
                return f"the token budget is spent ({self.tokens.total} of {b.max_tokens} tokens)"
            case "budget_sandbox_time":
                return (
                    f"the sandbox-time budget is spent ({self.sandbox_s:.1f} s of "
                    f"{b.max_sandbox_s:g} s)"
                )
            case _:
                return reason
