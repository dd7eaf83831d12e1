"""The gate: a request measured against a profile, and the code against the checks, before any run.

:func:`admit` reads nothing but its arguments (and the wheel cache's lock it is given): it refuses
a request that asks for more than the profile allows (a language, an export, inputs, a limit above
a ceiling, a network the host cannot enforce) with a ConfigError, and otherwise returns the request
with its limits and packages resolved and the one decision the profile gives its code: allow,
deny or approve.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from sandcell.errors import ConfigError
from sandcell.packages import WheelCache, imports_of, resolve_packages
from sandcell.policy._profile_sections import RUNTIME_IMPORTS
from sandcell.policy.checks import Decision, Finding, check, decide
from sandcell.policy.profiles import Profile
from sandcell.runtimes.offer import DEFAULT_OFFER
from sandcell.spec import DEFAULT_RUNTIME, NODE_LANGUAGES, Language, RunRequest

_CACHED_CODE_CHARS = 64 * 1024
"""Programs up to this size have their check findings kept (see :func:`_checked`)."""


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


def admit(
    request: RunRequest,
    profile: Profile,
    *,
    result_file: str | None = None,
    cache: WheelCache | None = None,
) -> Admission:
    """Check ``request`` against ``profile``; raise ConfigError for what the profile forbids.

    With a wheel ``cache``, a Python import of a package outside the runtime is resolved: an
    allowed cached package is mounted into the run, anything else is a ``py.package`` denial.
    """
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
    runtime = _runtime_of(request, profile)
    allowlist = profile.import_allowlist()
    if allowlist is not None and RUNTIME_IMPORTS in allowlist:
        node = request.language in NODE_LANGUAGES
        offered = _node_offered() if node else _offered(runtime)
        allowlist = (allowlist - {RUNTIME_IMPORTS}) | offered
    packages: tuple[Path, ...] = request.packages
    package_findings: tuple[Finding, ...] = ()
    if cache is not None and request.language == "python":
        resolution = resolve_packages(
            imports_of(request.code),
            allowed_packages=profile.runtime.allowed_packages,
            cache=cache,
            code=request.code,
            local=_local_modules(request),
            runtime=runtime,
        )
        packages = tuple(dict.fromkeys((*packages, *resolution.paths)))
        package_findings = resolution.findings
        if allowlist is not None:
            # A package the profile allows from the cache brings its import names with it.
            allowlist = allowlist | {name for p in resolution.packages for name in p.imports}
    findings = [
        *_checked(
            request.code,
            request.language,
            allowlist,
            profile.allows_network(),
            bash=profile.allows_language("bash"),
        ),
        *package_findings,
    ]
    decision = decide(
        findings,
        approval=profile.approval,
        severity_overrides=profile.checks.severity,
        disabled=profile.checks.disabled,
    )
    return Admission(
        request=replace(
            request, limits=limits, exports=exports, packages=packages, runtime=runtime
        ),
        decision=decision,
        profile=profile,
        result_file=result_file,
    )


def _runtime_of(request: RunRequest, profile: Profile) -> str:
    """The run's runtime: the one it asks for, if the profile lets it choose, else the
    profile's."""
    rules = profile.runtime
    if request.runtime is None or request.runtime == rules.runtime:
        return rules.runtime
    # "name@tree" (a replay's exact build) is allowed where the name is.
    if rules.runtimes is not None and request.runtime.split("@")[0] not in rules.runtimes:
        allowed = ", ".join(dict.fromkeys((rules.runtime, *rules.runtimes)))
        raise ConfigError(
            f"profile {profile.name!r} does not allow runtime {request.runtime!r} (it allows: "
            f"{allowed}); ask for one of those, or use a profile that allows it"
        )
    return request.runtime


def _offered(runtime: str) -> frozenset[str]:
    if runtime == DEFAULT_RUNTIME:
        return frozenset(DEFAULT_OFFER)  # no metadata to read: the common case stays cheap
    from sandcell.runtimes.offer import offer

    return offer(runtime).offered


@lru_cache(maxsize=1)
def _node_offered() -> frozenset[str]:
    """What ``@runtime`` allows a JavaScript or TypeScript program: the Node runtime's locked
    packages (Node's safe built-ins are added by the checks themselves, as the safe standard
    library is for Python)."""
    from sandcell.runtimes.node.locked import locked_packages

    return frozenset(locked_packages())


def _checked(
    code: str,
    language: Language,
    allowlist: Collection[str] | None,
    network: bool,
    *,
    bash: bool = True,
) -> tuple[Finding, ...]:
    """:func:`check`'s findings, remembered for the programs seen last.

    The checks read nothing but these arguments (no host state, no clock), so the same
    program under the same allowlist and network gets the same findings: a batch or an agent
    that runs one program many times parses it once. The key is the whole text, not a digest
    of it, so two programs can never share an entry; large programs are not kept.
    """
    frozen = None if allowlist is None else frozenset(allowlist)
    if len(code) > _CACHED_CODE_CHARS:
        return tuple(check(code, language, allowed_imports=frozen, network=network, bash=bash))
    return _checked_cached(code, language, frozen, network, bash)


@lru_cache(maxsize=128)
def _checked_cached(
    code: str, language: Language, allowlist: frozenset[str] | None, network: bool, bash: bool
) -> tuple[Finding, ...]:
    return tuple(check(code, language, allowed_imports=allowlist, network=network, bash=bash))


def _local_modules(request: RunRequest) -> set[str]:
    """Modules the run brings itself: its Python input files and input directories, and the
    tool gateway's client (allowed only by a profile with tools: ``Profile.import_allowlist``)."""
    return {i.name.removesuffix(".py") for i in request.inputs} | {"sandcell_tools"}
