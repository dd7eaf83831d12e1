"""Outcomes and errors to exit codes, as :mod:`sandcell.wire` (the one wire table) maps them.

======================  =========================================================
exit code               meaning
======================  =========================================================
0                       ``ok``
1-119                   ``error``: the program's own non-zero exit status
120                     ``output_limit``: stdout or stderr went over its cap
121                     ``memory_limit``
122                     ``invalid_output``: the declared result failed validation
123                     ``denied``: the policy refused the code; it did not run
124                     ``timeout``: wall-time or CPU-time limit (as GNU timeout)
125                     ``awaiting_approval``: stored for a person to approve; it did not run
128 + N                 ``killed``: the program died of signal N
2                       usage error on the command line
75                      ``infra_error``: the code never ran; safe to retry (EX_TEMPFAIL)
78                      configuration or isolation error (EX_CONFIG): fix the request or host
======================  =========================================================

An error's exit code is its row's in :mod:`sandcell.wire`: 75 for what a retry can mend (an
``InfraError``, a service's 429 ``QuotaExceeded``, a ``ModelError``), 78 for the rest.

A program that itself exits with 120-255 is indistinguishable without ``--json``, whose ``outcome``
field is authoritative.

``sandcell batch`` answers for many runs at once: 0 when every task has a result and passed, 1
(``EXIT_BATCH_FAILED``) when every task ran but at least one did not pass, 128 + N when signal N
interrupted it (the same command resumes), 78 for a bad tasks file (nothing ran).

``sandcell ask`` answers for its stop reason: 0 ``answered``; 1 ``retries_exhausted`` (no
trustworthy result); 3 (``EXIT_BUDGET``) ``budget_steps``, ``budget_tokens`` or
``budget_sandbox_time``; 75 ``model_error`` (the model could not be asked; try again later);
122 ``untraceable_answer``; 123 ``denied`` or ``approval_denied``; 125 ``awaiting_approval``;
78 when no model is configured (the message says how to configure one).
"""

from __future__ import annotations

from sandcell import wire
from sandcell.errors import SandcellError
from sandcell.spec import RunResult
from sandcell.wire import (
    EXIT_AWAITING_APPROVAL,
    EXIT_CONFIG,
    EXIT_DENIED,
    EXIT_INFRA,
    EXIT_INVALID_OUTPUT,
    EXIT_MEMORY_LIMIT,
    EXIT_OUTPUT_LIMIT,
    EXIT_TIMEOUT,
)

__all__ = [
    "EXIT_AWAITING_APPROVAL",
    "EXIT_BATCH_FAILED",
    "EXIT_BUDGET",
    "EXIT_CONFIG",
    "EXIT_DENIED",
    "EXIT_INFRA",
    "EXIT_INVALID_OUTPUT",
    "EXIT_MEMORY_LIMIT",
    "EXIT_OUTPUT_LIMIT",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "exit_code_for",
    "exit_code_for_batch",
    "exit_code_for_error",
    "exit_code_for_stop",
]

EXIT_USAGE = 2
EXIT_BATCH_FAILED = 1
EXIT_BUDGET = 3


def exit_code_for(result: RunResult) -> int:
    """The CLI exit status for a finished run."""
    return wire.exit_code_for_result(result)


def exit_code_for_error(exc: SandcellError) -> int:
    """The CLI exit status for a run that could not be attempted."""
    return wire.error_wire(exc).exit_code


def exit_code_for_batch(*, all_passed: bool, interrupted_by: int | None) -> int:
    """The CLI exit status for a batch: interrupted, some task not passed, or all passed."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    return 0 if all_passed else EXIT_BATCH_FAILED


_STOP_EXIT: dict[str, int] = {
    "answered": 0,
    "retries_exhausted": 1,
    "budget_steps": EXIT_BUDGET,
    "budget_tokens": EXIT_BUDGET,
    "budget_sandbox_time": EXIT_BUDGET,
    "model_error": EXIT_INFRA,
    "untraceable_answer": EXIT_INVALID_OUTPUT,
    "denied": EXIT_DENIED,
    "approval_denied": EXIT_DENIED,
    "awaiting_approval": EXIT_AWAITING_APPROVAL,
}


def exit_code_for_stop(stop_reason: str) -> int:
    """The CLI exit status of ``sandcell ask`` for the agent's stop reason."""
    return _STOP_EXIT.get(stop_reason, 1)
