"""The gate: a request measured against a profile, and the code against the checks, before any run.

:func:`admit` is pure (it reads nothing but its arguments): it refuses a request that asks for
more than the profile allows (a language, an export, inputs, a limit above a ceiling, a network
the host cannot enforce) with a ConfigError, and otherwise returns the request with its limits
resolved and the one decision the profile gives its code: allow, deny or approve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sandcell.errors import ConfigError
from sandcell.policy.checks import Decision, check, decide
from sandcell.policy.profiles import Profile
from sandcell.spec import RunRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """A request the profile accepts, and the decision on its code."""

    request: RunRequest
    """The request with its limits resolved (the profile's defaults where none were given)."""
    decision: Decision
    profile: Profile
    result_file: str | None
    """Where the declared result is read from (None: the last JSON line of stdout)."""

    def policy_record(self) -> dict[str, object]:
        """What the run record and the result say about the policy."""
        return {
            "profile": self.profile.to_record(),
            "verdict": self.decision.verdict,
            "reason": self.decision.reason,
            "findings": [f.to_dict() for f in self.decision.findings],
        }


def admit(request: RunRequest, profile: Profile, *, result_file: str | None = None) -> Admission:
    """Check ``request`` against ``profile``; raise ConfigError for what the profile forbids."""
    profile.require_enforceable()
    if not profile.allows_language(request.language):
        raise ConfigError(
            f"profile {profile.name!r} does not allow {request.language} programs; "
            "use a profile that does (sandcell policy list)"
        )
    if not profile.allows_inputs(len(request.inputs)):
        raise ConfigError(
            f"profile {profile.name!r} allows at most {profile.filesystem.max_inputs} inputs, "
            f"the request has {len(request.inputs)}"
        )
    for glob in request.exports:
        if not profile.allows_export(glob):
            allowed = ", ".join(profile.filesystem.export_globs) or "nothing"
            raise ConfigError(
                f"profile {profile.name!r} does not allow exporting {glob!r} (it allows: "
                f"{allowed}); export less, or use a profile that allows it"
            )
    limits = profile.limits_for(asdict(request.limits) if request.limits is not None else None)
    result_file = result_file or profile.validation.result_file
    exports = request.exports
    if result_file and result_file not in exports:
        # The declared result has to leave the sandbox to be validated; the profile or the
        # caller declared it, so it needs no export rule of its own.
        exports = (*exports, result_file)
    findings = check(
        request.code,
        request.language,
        allowed_imports=profile.import_allowlist(),
        network=profile.allows_network(),
    )
    decision = decide(
        findings,
        approval=profile.approval,
        severity_overrides=profile.checks.severity,
        disabled=profile.checks.disabled,
    )
    return Admission(
        request=replace(request, limits=limits, exports=exports),
        decision=decision,
        profile=profile,
        result_file=result_file,
    )
