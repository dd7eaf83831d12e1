"""The one wire table: each error class and each run outcome, as every surface answers it.

A row says, for one class of :class:`~sandcell.errors.SandcellError` (or one
:class:`~sandcell.spec.Outcome`), the command line's exit status, the HTTP status of the
service's problem document, the E2B status and Connect code, what the MCP tool error says, and
whether a retry can help. :func:`error_wire` walks the exception's MRO, so a subclass answers
as its parent unless it has a row of its own. The surfaces (:mod:`sandcell.status`,
:mod:`sandcell.service.problems`, :mod:`sandcell.e2b.errors`, :mod:`sandcell.mcp.tools`,
:mod:`sandcell.mcp.content`, :mod:`sandcell.client.errors`, :mod:`sandcell.cli.remote`) read
it and keep no mapping of their own (as do the approval pages, :mod:`sandcell.service.ui.pages`).
An E2B command is a background process of its session (:mod:`sandcell.e2b.process`): its stream
ends with the process's exit status, or with the error row of a spawn the profile refused
(``SpawnRefused``), never with a run's outcome.

Errors (``code``: the row's name, shown in MCP tool errors)::

    class                   code                  exit HTTP E2B Connect             retry
    SandcellError           internal                78  500  500 internal             no
    ConfigError             invalid_request         78  400  400 invalid_argument     no
    SessionEnded            session_ended           78  409  502 unavailable          no
    StateNotFound           state_not_found         78  404  404 not_found            no
    StateTampered           state_tampered          78  409  409 already_exists       no
    PauseRefused            pause_refused           78  422  422 unknown              no
    ProcessNotFound         process_not_found       78  404  404 not_found            no
    SpawnRefused            spawn_refused           78  403  403 permission_denied    no
    SpawnFailed             spawn_failed            78  422  400 failed_precondition  no
    PortNotAllowed          port_not_allowed        78  403  403 permission_denied    no
    PortClosed              port_closed             75  502  502 unavailable          yes
    QuotaExceeded (client)  quota_exceeded          75  429  429 resource_exhausted   yes
    IsolationUnavailable    isolation_unavailable   78  503  503 unavailable          no
    InfraError              infra_error             75  503  503 unavailable          yes
    StoreUnavailable        store_unavailable       75  503  503 unavailable          yes
    AuditError              audit_error             78  500  500 internal             no
    ModelError              model_error             75  500  500 internal             no
    ModelRateLimited        model_rate_limited      75  500  500 internal             yes
    ServiceProblem, E2BError  (carry their own status: 429 and 5xx as a retryable 75, other
                              4xx as 78; the Connect code follows the status)

Decisions where the surfaces used to disagree:

* ``SessionEnded`` is 409 Conflict on sandcell's HTTP API (the session exists and is over; the
  client turns a 409 back into ``SessionEnded``) but 502 on E2B, with a message saying the
  sandbox "was not found": that is what the E2B SDKs read as "the sandbox is gone" (envd's
  HTTP, ``SandboxNotRunning`` from the Connect code ``unavailable``); a 409 would reach the SDK
  as ``already_exists`` or a bare ``SandboxException``.
* An HTTP 429 is :class:`~sandcell.client.errors.QuotaExceeded` for the Python client and the
  command line alike (it stays a ``ServiceError``, a ``ConfigError``, for code that catches
  those), with its own row: exit 75 (EX_TEMPFAIL) and retryable, because a quota lifts.
* A 503 whose detail carries an isolation fix (``Fix: ...``) is an ``IsolationUnavailable``
  for both the client and the command line (exit 78, no retry); any other 5xx is
  ``ServiceUnavailable``, an ``InfraError`` (exit 75, retry).
* MCP tool errors keep the exception's whole sentence (an isolation error's ``Fix:``
  included) and end with the row's code and whether a retry can help, which a model cannot
  otherwise tell.
* E2B answers carry ``Should-Retry: false`` for every error sandcell answers from this table
  on a status the SDK would retry (429, 502, 503, 504): the SDK retries three times at once,
  which no quota, ended sandbox or host without the isolation outlives.
* A saved session state (:mod:`sandcell.sessions.states`) that is not the caller's, or gone,
  is 404 as any other tenant's thing is; one whose bytes changed on disk is 409 (it exists and
  will never load); a pause, snapshot or fork in a mode the session's rung does not offer is
  422 (the request is well formed; this session cannot do it), so a client tells it from a
  malformed request (400) and from an ended session (409).
* A session's background process (:mod:`sandcell.sessions.processes`) or watch that is not
  there is 404; a command the profile refuses to start in the background is 403, as E2B
  answers a denied command; one that was admitted but could not start (the session's process
  limit, no such program), or an operation the process cannot take (input to a process
  without open stdin, a resize without a terminal), is 422 on HTTP and envd's
  ``failed_precondition`` (400) on E2B. All exit 78, as the refusals they are.
* ``ModelError`` exits 75, as ``sandcell ask`` does for the stop reason ``model_error``.
* A row the service keeps to its log (``public`` False: internal, audit, model errors) reaches
  a remote client as a 500 it cannot tell from a passing failure: ``ServiceUnavailable``,
  exit 75. Exceptions used only inside one module (a proxy's refusal, a guest channel's
  protocol error) are in the tree too and answer as ``internal`` should one ever escape.

The problem document's ``type`` stays ``about:blank`` (its ``title`` is the status's), so the
HTTP body is what it was; the row's ``code`` names the class in MCP errors and the docs.

Outcomes are results, not errors: the service answers them 200 with the result, whatever the
outcome. Their row holds the exit status, whether MCP reports the call as failed (the code
never ran), the E2B error a command's stream ends with (None: an ``end`` event with the exit
code) and whether a retry can help.

Rows are keyed by the class's qualified name, so that the CLI can read the table without
importing the service's, E2B's or the client's modules; ``tests/unit/test_wire_table.py`` checks
that every key names a class and that every class resolves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from sandcell.spec import Outcome, RunResult

__all__ = [
    "CONNECT_CODES",
    "ERRORS",
    "EXIT_AWAITING_APPROVAL",
    "EXIT_CONFIG",
    "EXIT_DENIED",
    "EXIT_INFRA",
    "EXIT_INVALID_OUTPUT",
    "EXIT_MEMORY_LIMIT",
    "EXIT_OUTPUT_LIMIT",
    "EXIT_TIMEOUT",
    "OUTCOMES",
    "SDK_RETRIED",
    "TITLES",
    "ErrorWire",
    "OutcomeWire",
    "class_wire",
    "connect_code",
    "error_wire",
    "exit_code_for_result",
    "mcp_message",
    "outcome_wire",
    "public_message",
    "title",
]

EXIT_OUTPUT_LIMIT = 120
EXIT_MEMORY_LIMIT = 121
EXIT_INVALID_OUTPUT = 122
EXIT_DENIED = 123
EXIT_TIMEOUT = 124
EXIT_AWAITING_APPROVAL = 125
EXIT_INFRA = 75
EXIT_CONFIG = 78

TITLES: Mapping[int, str] = MappingProxyType(
    {
        400: "Bad request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not found",
        405: "Method not allowed",
        409: "Conflict",
        413: "Content too large",
        422: "Invalid request",
        429: "Too many requests",
        500: "Internal error",
        503: "Unavailable",
    }
)
"""The problem document's ``title`` for each status (``Error`` for any other)."""

CONNECT_CODES: Mapping[int, str] = MappingProxyType(
    {
        400: "invalid_argument",
        401: "unauthenticated",
        403: "permission_denied",
        404: "not_found",
        409: "already_exists",
        413: "resource_exhausted",
        429: "resource_exhausted",
        501: "unimplemented",
        502: "unavailable",
        503: "unavailable",
        504: "deadline_exceeded",
    }
)
"""The Connect error code for each HTTP status envd answers with."""

SDK_RETRIED = frozenset({429, 502, 503, 504})
"""The statuses the E2B SDK retries unless told ``Should-Retry: false``."""


def connect_code(status: int) -> str:
    """The Connect error code for an HTTP status."""
    return CONNECT_CODES.get(status, "internal" if status >= 500 else "unknown")


def title(status: int) -> str:
    """The problem document's title for ``status``."""
    return TITLES.get(status, "Error")


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorWire:
    """How one class of error is answered on each surface."""

    code: str
    """The row's name: shown in MCP tool errors, used in the docs."""
    exit_code: int
    http_status: int
    e2b_status: int
    retryable: bool
    """Whether the same request, sent again later, can succeed."""
    public: bool = True
    """Whether the exception's own sentence may go to a remote client; False: ``detail`` goes
    instead, and the service logs the exception."""
    detail: str = ""
    e2b_message: str = "{}"
    """The E2B message, the exception's sentence in place of ``{}``."""
    mcp_message: str = "{}"
    """The MCP tool error's sentence, the exception's in place of ``{}``."""
    carries_status: bool = False
    """The exception's ``status`` attribute decides the statuses, exit code and retry."""
    connect: str = ""
    """The Connect error code of envd's RPCs; empty: the one for ``e2b_status``."""

    def __post_init__(self) -> None:
        if not self.connect:
            object.__setattr__(self, "connect", connect_code(self.e2b_status))


_INTERNAL = "the service failed to answer; its log has the details"

ERRORS: Mapping[str, ErrorWire] = MappingProxyType(
    {
        "sandcell.errors.SandcellError": ErrorWire(
            code="internal",
            exit_code=EXIT_CONFIG,
            http_status=500,
            e2b_status=500,
            retryable=False,
            public=False,
            detail=_INTERNAL,
        ),
        "sandcell.errors.ConfigError": ErrorWire(
            code="invalid_request",
            exit_code=EXIT_CONFIG,
            http_status=400,
            e2b_status=400,
            retryable=False,
        ),
        "sandcell.sessions.session.SessionEnded": ErrorWire(
            code="session_ended",
            exit_code=EXIT_CONFIG,
            http_status=409,
            e2b_status=502,
            retryable=False,
            e2b_message="the sandbox was not found: {}",
        ),
        "sandcell.sessions.states.StateNotFound": ErrorWire(
            code="state_not_found",
            exit_code=EXIT_CONFIG,
            http_status=404,
            e2b_status=404,
            retryable=False,
        ),
        "sandcell.sessions.states.StateTampered": ErrorWire(
            code="state_tampered",
            exit_code=EXIT_CONFIG,
            http_status=409,
            e2b_status=409,
            retryable=False,
        ),
        "sandcell.backends.cell.state.PauseRefused": ErrorWire(
            code="pause_refused",
            exit_code=EXIT_CONFIG,
            http_status=422,
            e2b_status=422,
            retryable=False,
        ),
        "sandcell.sessions.processes.ProcessNotFound": ErrorWire(
            code="process_not_found",
            exit_code=EXIT_CONFIG,
            http_status=404,
            e2b_status=404,
            retryable=False,
        ),
        "sandcell.sessions.processes.SpawnRefused": ErrorWire(
            code="spawn_refused",
            exit_code=EXIT_CONFIG,
            http_status=403,
            e2b_status=403,
            retryable=False,
        ),
        "sandcell.sessions.processes.SpawnFailed": ErrorWire(
            code="spawn_failed",
            exit_code=EXIT_CONFIG,
            http_status=422,
            e2b_status=400,
            retryable=False,
            connect="failed_precondition",
        ),
        # A session's ports (sessions/ports.py): a port its profile does not list is forbidden;
        # nothing listening is the upstream's answer, which may change once the program serves.
        "sandcell.network.ingress.PortNotAllowed": ErrorWire(
            code="port_not_allowed",
            exit_code=EXIT_CONFIG,
            http_status=403,
            e2b_status=403,
            retryable=False,
        ),
        "sandcell.network.ingress.PortClosed": ErrorWire(
            code="port_closed",
            exit_code=EXIT_INFRA,
            http_status=502,
            e2b_status=502,
            retryable=True,
        ),
        "sandcell.client.errors.QuotaExceeded": ErrorWire(
            code="quota_exceeded",
            exit_code=EXIT_INFRA,
            http_status=429,
            e2b_status=429,
            retryable=True,
        ),
        "sandcell.errors.IsolationUnavailable": ErrorWire(
            code="isolation_unavailable",
            exit_code=EXIT_CONFIG,
            http_status=503,
            e2b_status=503,
            retryable=False,
        ),
        "sandcell.errors.InfraError": ErrorWire(
            code="infra_error",
            exit_code=EXIT_INFRA,
            http_status=503,
            e2b_status=503,
            retryable=True,
        ),
        # The shared database is down or restarting: answered with Retry-After, and its
        # address stays in the service's log.
        "sandcell.errors.StoreUnavailable": ErrorWire(
            code="store_unavailable",
            exit_code=EXIT_INFRA,
            http_status=503,
            e2b_status=503,
            retryable=True,
            public=False,
            detail="the service's database cannot be reached just now; retry shortly",
        ),
        "sandcell.errors.AuditError": ErrorWire(
            code="audit_error",
            exit_code=EXIT_CONFIG,
            http_status=500,
            e2b_status=500,
            retryable=False,
            public=False,
            detail="the run records could not be read or written; the service's log says why",
        ),
        "sandcell.errors.ModelError": ErrorWire(
            code="model_error",
            exit_code=EXIT_INFRA,
            http_status=500,
            e2b_status=500,
            retryable=False,
            public=False,
            detail=_INTERNAL,
        ),
        "sandcell.errors.ModelRateLimited": ErrorWire(
            code="model_rate_limited",
            exit_code=EXIT_INFRA,
            http_status=500,
            e2b_status=500,
            retryable=True,
            public=False,
            detail=_INTERNAL,
        ),
        "sandcell.service.problems.ServiceProblem": ErrorWire(
            code="refused",
            exit_code=EXIT_CONFIG,
            http_status=400,
            e2b_status=400,
            retryable=False,
            carries_status=True,
            mcp_message="refused: {}",
        ),
        "sandcell.e2b.errors.E2BError": ErrorWire(
            code="e2b_error",
            exit_code=EXIT_CONFIG,
            http_status=400,
            e2b_status=400,
            retryable=False,
            carries_status=True,
        ),
    }
)
"""Each row, by the qualified name of its class."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def class_wire(cls: type[BaseException]) -> ErrorWire:
    """The row of ``cls``: its own, else its nearest ancestor's; an exception outside the tree
    answers as an unexpected failure."""
    for ancestor in cls.__mro__:
        row = ERRORS.get(_name(ancestor))
        if row is not None:
            return row
    return ERRORS["sandcell.errors.SandcellError"]


def error_wire(exc: BaseException) -> ErrorWire:
    """The row for ``exc``, its statuses taken from it where its class carries them."""
    row = class_wire(type(exc))
    status = getattr(exc, "status", None)
    if not row.carries_status or not isinstance(status, int):
        return row
    transient = status == 429 or status >= 500
    return dataclasses.replace(
        row,
        exit_code=EXIT_INFRA if transient else EXIT_CONFIG,
        http_status=status,
        e2b_status=status,
        connect=str(getattr(exc, "code", None) or connect_code(status)),
        retryable=transient,
    )


def public_message(exc: BaseException, row: ErrorWire | None = None) -> str:
    """What a remote client is told of ``exc``: its sentence, or the row's fixed one."""
    row = row or error_wire(exc)
    return str(exc) if row.public else row.detail


def mcp_message(exc: BaseException) -> str:
    """The MCP tool error's text for ``exc``: its whole sentence (an isolation fix included),
    then the row's code and whether a retry can help."""
    row = error_wire(exc)
    text = row.mcp_message.format(str(exc))
    fix = getattr(exc, "fix", "")
    if fix and fix not in text:
        text += f". Fix: {fix}"
    retry = "a retry may help" if row.retryable else "do not retry it unchanged"
    return f"{text} [{row.code}; {retry}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeWire:
    """How one outcome of a run is answered on each surface."""

    exit_code: int
    """The command line's exit status (see ``exit_from``)."""
    exit_from: Literal["fixed", "program", "signal"] = "fixed"
    """``program``: the program's own status (``exit_code`` when it has none); ``signal``:
    128 + the signal (``exit_code`` - 128 when there is none)."""
    mcp_is_error: bool = False
    """Whether the MCP call is reported failed (the code never ran)."""
    retryable: bool = False


OUTCOMES: Mapping[Outcome, OutcomeWire] = MappingProxyType(
    {
        Outcome.OK: OutcomeWire(exit_code=0),
        Outcome.ERROR: OutcomeWire(exit_code=1, exit_from="program"),
        Outcome.TIMEOUT: OutcomeWire(exit_code=EXIT_TIMEOUT),
        Outcome.MEMORY_LIMIT: OutcomeWire(exit_code=EXIT_MEMORY_LIMIT),
        Outcome.OUTPUT_LIMIT: OutcomeWire(exit_code=EXIT_OUTPUT_LIMIT),
        Outcome.KILLED: OutcomeWire(exit_code=128 + 9, exit_from="signal"),
        Outcome.INFRA_ERROR: OutcomeWire(exit_code=EXIT_INFRA, mcp_is_error=True, retryable=True),
        Outcome.DENIED: OutcomeWire(exit_code=EXIT_DENIED, mcp_is_error=True),
        Outcome.AWAITING_APPROVAL: OutcomeWire(exit_code=EXIT_AWAITING_APPROVAL),
        Outcome.INVALID_OUTPUT: OutcomeWire(exit_code=EXIT_INVALID_OUTPUT),
    }
)


def outcome_wire(outcome: Outcome) -> OutcomeWire:
    return OUTCOMES[outcome]


def exit_code_for_result(result: RunResult) -> int:
    """The command line's exit status for a finished run."""
    row = OUTCOMES[result.outcome]
    if row.exit_from == "program":
        return result.exit_code or row.exit_code
    if row.exit_from == "signal":
        return 128 + result.signal if result.signal else row.exit_code
    return row.exit_code
