"""The one exception hierarchy of sandcell.

::

    SandcellError
    ├── ConfigError            the caller asked for something invalid (bad limit, file, glob)
    ├── IsolationUnavailable   a layer the run asks for cannot be enforced on this host
    ├── InfraError             sandcell itself failed before the code ran; safe to retry
    ├── AuditError             the run record store is unusable or was tampered with
    └── ModelError             the language model could not be asked (auth, rate limit, network)
        └── ModelRateLimited   the provider said to slow down (retry after a delay)

An outcome of a run (timeout, memory limit, non-zero exit...) is not an exception: it is a field
of :class:`sandcell.spec.RunResult`. Exceptions are for runs that could not be attempted.
"""

from __future__ import annotations


class SandcellError(Exception):
    """Base class of every error sandcell raises on purpose."""


class ConfigError(SandcellError, ValueError):
    """The request or the configuration is invalid; the message says what and how to fix it."""


class IsolationUnavailable(SandcellError, RuntimeError):
    """A requested isolation layer cannot be enforced here.

    Never downgraded silently: the message names the missing piece and how to fix the host, and
    a weaker mode has to be asked for by name.
    """

    def __init__(self, layer: str, reason: str, fix: str) -> None:
        super().__init__(f"{layer} is unavailable: {reason}. Fix: {fix}")
        self.layer = layer
        self.reason = reason
        self.fix = fix


class InfraError(SandcellError, RuntimeError):
    """sandcell failed before the code could run (spawn failure, I/O error); safe to retry."""


class StoreUnavailable(InfraError):
    """The shared database ($SANDCELL_DATABASE_URL) cannot be reached now; nothing was changed
    by the call that raised it, and it is safe to retry once the database is back."""


class AuditError(SandcellError, RuntimeError):
    """The audit store cannot be opened or written."""


class ModelError(SandcellError, RuntimeError):
    """The model provider refused or failed a request; the message says which and why."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ModelRateLimited(ModelError):
    """The provider answered 429 (or an overload); ``retry_after_s`` is its hint, if it gave one."""

    def __init__(
        self, message: str, *, status: int | None = 429, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, status=status, retryable=True)
        self.retry_after_s = retry_after_s
