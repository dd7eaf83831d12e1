"""Validation of what comes out of a run, before anything is handed on.

The last step of the cycle (check → run → observe → **validate**): nothing the code produced
travels on as if it were right without passing here.

* :mod:`~sandcell.validation.result`: the declared result (the last JSON line of stdout, or a
  result file) checked against a JSON Schema or a pydantic model, with readable errors
  (``$.rows[3].rate: -5 is less than the minimum of 0``).
* :mod:`~sandcell.validation.invariants`: facts the caller knows must hold
  (``0 <= result["rate"] <= 100``), as Python callables or as a small, safely interpreted
  expression language for the command line.
* :mod:`~sandcell.validation.redact`: the leak scan. Known secret values and token patterns
  are redacted from everything that leaves the sandbox and reported.
* :mod:`~sandcell.validation.terminal`: control and escape sequences made visible and harmless
  before output reaches a terminal (for display only).

:func:`validate_output` runs all of it on one run's output. A result that fails gives the run
the outcome ``invalid_output``, with :attr:`OutputReport.errors` saying why.

Artifacts are scanned, not rewritten, by default (:func:`scan_artifact`): an artifact is a file
the caller asked for by name and stored under its SHA-256, and silently changing its bytes
would break that. The caller decides what a leak in an artifact means: refuse the export, or
store the redacted bytes from :meth:`Redactor.scan_bytes` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from sandcell.validation.confined import ConfinedChecks, ConfinementLimits, default_checks
from sandcell.validation.invariants import (
    Invariant,
    InvariantLike,
    check_invariants,
    invariant_failure,
    parse_invariant,
)
from sandcell.validation.redact import DEFAULT_PATTERNS, Leak, Pattern, Redactor
from sandcell.validation.result import (
    ValidationReport,
    capped_errors,
    check_schema,
    extract_result,
    load_schema,
    validate_result,
)
from sandcell.validation.terminal import is_tty_safe, neutralise

if TYPE_CHECKING:
    import pydantic

__all__ = [
    "DEFAULT_PATTERNS",
    "ConfinedChecks",
    "ConfinementLimits",
    "Invariant",
    "InvariantLike",
    "Leak",
    "OutputReport",
    "Pattern",
    "Redactor",
    "ValidationReport",
    "capped_errors",
    "check_invariants",
    "check_schema",
    "default_checks",
    "extract_result",
    "invariant_failure",
    "is_tty_safe",
    "load_schema",
    "neutralise",
    "parse_invariant",
    "scan_artifact",
    "validate_output",
    "validate_result",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputReport:
    """What validation found in one run's output."""

    valid: bool
    """True when the declared result was found and passed the schema, the model and every
    invariant (or when no result was declared). False means outcome ``invalid_output``."""
    errors: tuple[str, ...]
    """Why it is not valid: a missing result, schema or model errors, failed invariants."""
    value: object | None
    """The result, redacted and validated (the model instance when a model was given); None
    when not valid. With nothing declared, whatever JSON result stdout had, unchecked."""
    stdout: str
    """stdout with secrets redacted. Not terminal-neutralised: that is for display only."""
    stderr: str
    """stderr with secrets redacted."""
    leaks: tuple[Leak, ...]
    """Every secret redacted, with ``stream`` set to ``stdout``, ``stderr`` or ``result`` (the
    declared result, when it came from the result file or held a secret stdout did not show)."""


def _redact_value(value: object, redactor: Redactor, leaks: list[Leak]) -> object:
    """``value`` with every string in it (keys included) redacted; leaks go to ``leaks``."""
    if isinstance(value, str):
        text, found = redactor.scan_text(value)
        leaks.extend(found)
        return text
    if isinstance(value, list):
        return [_redact_value(v, redactor, leaks) for v in value]
    if isinstance(value, dict):
        return {
            _redact_value(k, redactor, leaks): _redact_value(v, redactor, leaks)
            for k, v in value.items()
        }
    return value


def _is_declared(
    result_file: bytes | None, schema: object, model: object, invariants: Sequence[object]
) -> bool:
    return result_file is not None or schema is not None or model is not None or bool(invariants)


def validate_output(
    *,
    stdout: str,
    stderr: str,
    result_file: bytes | None = None,
    schema: Mapping[str, object] | None = None,
    model: type[pydantic.BaseModel] | None = None,
    invariants: Sequence[InvariantLike] = (),
    known_secrets: Sequence[str] = (),
    checks: ConfinedChecks | None = None,
) -> OutputReport:
    """Validate and scan one run's output.

    A result is *declared* when a result file, a schema, a model or an invariant is given; it
    must then be found (see :func:`extract_result`) and pass every check. The result is
    redacted before it is checked, so what passes is exactly what is handed on; invariants see
    its JSON form (for a model, ``model_dump(mode="json")``).

    Args:
        stdout: The run's standard output.
        stderr: The run's standard error.
        result_file: The bytes of the run's result file, if it exported one.
        schema: A JSON Schema the result must match.
        model: A pydantic model class the result must validate as.
        invariants: Conditions on the result (callables, parsed or textual invariants).
        known_secrets: Secret values to redact wherever they appear (see :class:`Redactor`).
        checks: Where the schema and the textual invariants are evaluated (default: the
            process's pool of confined workers, :func:`confined.default_checks`).

    Raises:
        ConfigError: for an invalid schema or invariant. Check both when the request is made
            (:func:`check_schema`, :func:`parse_invariant`) so this cannot happen after a run.
    """
    redactor = _redactor(tuple(known_secrets))
    safe_stdout, stdout_leaks = redactor.scan_text(stdout)
    safe_stderr, stderr_leaks = redactor.scan_text(stderr)
    leaks = [replace(leak, stream="stdout") for leak in stdout_leaks]
    leaks += [replace(leak, stream="stderr") for leak in stderr_leaks]

    # The result is parsed from the original text (a redaction cannot break its JSON) and then
    # redacted string by string, which also finds secrets hidden by JSON escapes ("\u0067hp_").
    # Offsets of its leaks are within the JSON string they were found in. A leak already
    # reported from stdout is not reported twice.
    raw, missing = extract_result(stdout, result_file)
    value_leaks: list[Leak] = []
    value = None if raw is None else _redact_value(raw, redactor, value_leaks)
    seen = {(leak.kind, leak.preview) for leak in stdout_leaks} if result_file is None else set()
    leaks += [
        replace(leak, stream="result")
        for leak in value_leaks
        if (leak.kind, leak.preview) not in seen
    ]
    report = OutputReport(
        valid=True, errors=(), value=value, stdout=safe_stdout, stderr=safe_stderr, leaks=()
    )
    if not _is_declared(result_file, schema, model, invariants):
        return replace(report, leaks=tuple(leaks))
    if missing is not None:
        return replace(report, valid=False, errors=(missing,), value=None, leaks=tuple(leaks))

    errors, validated = _checked(value, schema, model, invariants, checks)
    if errors:
        return replace(report, valid=False, errors=errors, value=None, leaks=tuple(leaks))
    return replace(report, value=validated, leaks=tuple(leaks))


def _checked(
    value: object,
    schema: Mapping[str, object] | None,
    model: type[pydantic.BaseModel] | None,
    invariants: Sequence[InvariantLike],
    checks: ConfinedChecks | None,
) -> tuple[tuple[str, ...], object]:
    """Why ``value`` fails, and the value handed on (the model instance when a model is given).

    The schema's errors and the model's come first; only if both passed, the failed invariants,
    in the order given. The schema and the textual invariants come from the requester and are
    evaluated in a confined worker; the model and callables are the caller's own code and run
    here."""
    model_report = validate_result(value, model=model) if model is not None else None
    subject = value
    if model_report is not None and model_report.value is not None:
        subject = model_report.value.model_dump(mode="json")  # type: ignore[attr-defined]
    compiled = [parse_invariant(i) if isinstance(i, str) else i for i in invariants]
    texts = [i.source for i in compiled if isinstance(i, Invariant)]
    model_ok = model_report is None or model_report.ok
    verdict = None
    if schema is not None or texts:
        verdict = (checks or default_checks()).check(
            value, schema=schema, invariants=texts if model_ok else (), subject=subject
        )
    errors = [*(verdict.schema_errors if verdict else ())]
    errors += model_report.errors if model_report else ()
    if errors:
        return capped_errors(errors), None
    confined = iter(verdict.invariant_failures or () if verdict else ())
    failures = [
        next(confined) if isinstance(i, Invariant) else invariant_failure(subject, i, position)
        for position, i in enumerate(compiled, start=1)
    ]
    validated = model_report.value if model_report is not None else value
    return tuple(f for f in failures if f is not None), validated


@lru_cache(maxsize=8)
def _redactor(known_secrets: tuple[str, ...]) -> Redactor:
    """One :class:`Redactor` per set of secrets: building one compiles every pattern for text
    and for bytes (about half a millisecond), and an executor scans each run with the same
    secrets. A Redactor holds no state between scans."""
    return Redactor(known_secrets)


def scan_artifact(
    data: bytes, *, path: str = "", known_secrets: Sequence[str] = ()
) -> tuple[Leak, ...]:
    """Report the secrets in an artifact's bytes, each with ``stream`` set to ``path``.

    Reports only: the artifact is left as it is (see the module docstring). To store a redacted
    copy instead, use ``Redactor(known_secrets).scan_bytes(data)``.
    """
    _, leaks = _redactor(tuple(known_secrets)).scan_bytes(data)
    return tuple(replace(leak, stream=path) for leak in leaks)
