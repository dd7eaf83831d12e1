"""The first step of every run and session cell: admit the request under a profile, choose its
backend, prepare the validators of its declared result, and read the profile's verdict.

Nothing runs here. A request the profile cannot accept at all raises ConfigError (from
:func:`sandcell.policy.gate.admit`, or for a bad schema or invariant); a runtime that is not
built, or a rung the host lacks, raises from the ``backend`` chooser. What the verdict leads to
(run, record a denial, wait for approval) is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandcell.backends.base import Backend
from sandcell.packages.wheel_cache import WheelCache
from sandcell.pipeline.validators import Validators
from sandcell.policy.gate import Admission, admit
from sandcell.policy.profiles import Profile
from sandcell.spec import RunRequest
from sandcell.validation import InvariantLike

if TYPE_CHECKING:
    import pydantic


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A request the profile accepts, ready for its verdict to be acted on."""

    admission: Admission
    backend: Backend
    """The backend the run goes to (and its record names)."""
    validators: Validators
    policy: Mapping[str, object]
    """What the run record and the result say about the policy."""

    @property
    def request(self) -> RunRequest:
        """The admitted request: limits, exports, packages and runtime resolved."""
        return self.admission.request

    @property
    def verdict(self) -> str:
        """``allow``, ``deny`` or ``approve``."""
        return self.admission.decision.verdict

    @property
    def denial(self) -> str:
        """The reason a denied run's result gives."""
        profile = self.admission.profile.name
        return f"denied by profile {profile!r}: {self.admission.decision.reason}"


def prepare(
    request: RunRequest,
    profile: Profile,
    *,
    wheels: WheelCache,
    backend: Callable[[RunRequest], Backend],
    result_file: str | None = None,
    schema: Mapping[str, object] | None = None,
    model: type[pydantic.BaseModel] | None = None,
    invariants: Sequence[InvariantLike] = (),
) -> Prepared:
    """Admit ``request`` under ``profile`` (packages resolved from ``wheels``), then ask
    ``backend`` for the backend of the admitted request, then prepare the validators."""
    admission = admit(request, profile, result_file=result_file, cache=wheels)
    chosen = backend(admission.request)
    validators = Validators.make(admission, schema=schema, model=model, invariants=invariants)
    return Prepared(
        admission=admission,
        backend=chosen,
        validators=validators,
        policy=admission.policy_record(),
    )
