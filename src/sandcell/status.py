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
