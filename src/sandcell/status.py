"""Outcomes and errors to exit codes: the one place the mapping lives.

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

from sandcell.errors import ConfigError, InfraError, IsolationUnavailable, SandcellError
from sandcell.spec import Outcome, RunResult

EXIT_OUTPUT_LIMIT = 120
EXIT_MEMORY_LIMIT = 121
EXIT_INVALID_OUTPUT = 122
EXIT_DENIED = 123
EXIT_TIMEOUT = 124
EXIT_AWAITING_APPROVAL = 125
EXIT_USAGE = 2
EXIT_INFRA = 75
EXIT_CONFIG = 78
EXIT_BATCH_FAILED = 1
EXIT_BUDGET = 3


def exit_code_for(result: RunResult) -> int:
    """The CLI exit status for a finished run."""
    match result.outcome:
        case Outcome.OK:
            return 0
        case Outcome.ERROR:
            return result.exit_code or 1
        case Outcome.TIMEOUT:
            return EXIT_TIMEOUT
        case Outcome.MEMORY_LIMIT:
            return EXIT_MEMORY_LIMIT
        case Outcome.OUTPUT_LIMIT:
            return EXIT_OUTPUT_LIMIT
        case Outcome.KILLED:
            return 128 + (result.signal or 9)
        case Outcome.INFRA_ERROR:
            return EXIT_INFRA
        case Outcome.INVALID_OUTPUT:
            return EXIT_INVALID_OUTPUT
        case Outcome.DENIED:
            return EXIT_DENIED
        case Outcome.AWAITING_APPROVAL:
            return EXIT_AWAITING_APPROVAL


def exit_code_for_error(exc: SandcellError) -> int:
    """The CLI exit status for a run that could not be attempted."""
    if isinstance(exc, ConfigError | IsolationUnavailable):
        return EXIT_CONFIG
    if isinstance(exc, InfraError):
        return EXIT_INFRA
    return EXIT_CONFIG


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
