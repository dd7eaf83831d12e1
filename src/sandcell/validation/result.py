"""The declared result of a run: find it in the output, check it against a schema or a model.

A program declares its result in one of two ways:

* it writes ``result.json`` (or another result file the caller names) in the working directory,
  exported like any artifact; the caller passes that file's bytes here;
* it prints the result as JSON on stdout, usually as the last line (``print(json.dumps(r))``),
  after whatever else it printed.

The caller gives the shape the result must have: a JSON Schema (``sandcell run --schema FILE``,
or a mapping from Python) or a pydantic model class. A result that does not fit is reported with
one readable line per problem, each starting with the JSON path of the offending part
(``$.rows[3].rate: -5 is less than the minimum of 0``), so that a model can fix its code from
the message alone.

JSON here is strict JSON: ``NaN`` and ``Infinity`` (which Python's :func:`json.dumps` writes by
default) are refused, because ``NaN`` compares false with everything and would slip through
``minimum``/``maximum`` checks unnoticed.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from sandcell.errors import ConfigError

# jsonschema (with referencing, attrs and the format checkers) is imported when a schema is
# checked or used: most runs declare none, and the executor that imports this module is on the
# path of every command line run.
if TYPE_CHECKING:
    import pydantic
    import referencing.exceptions

__all__ = [
    "MAX_ERRORS",
    "ValidationReport",
    "capped_errors",
    "check_schema",
    "extract_result",
    "json_path",
    "load_schema",
    "validate_result",
]

MAX_ERRORS = 20
"""Most lines in :attr:`ValidationReport.errors`; past it the last line says more were left out.
A model reading the errors needs the first few, not ten thousand."""

_MAX_MESSAGE_CHARS = 300
"""A message quotes the offending value; a huge value is cut to keep the report readable."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@functools.cache
def _dialects() -> dict[str, Any]:
    """The JSON Schema dialects jsonschema implements, by the URI a schema names in
    ``$schema``. A schema without ``$schema`` is read as 2020-12."""
    import jsonschema  # type: ignore[import-untyped]  # ships no type information

    return {
        str(cls.META_SCHEMA.get("$id", cls.META_SCHEMA.get("id", ""))).rstrip("#"): cls
        for cls in (
            jsonschema.Draft4Validator,
            jsonschema.Draft6Validator,
            jsonschema.Draft7Validator,
            jsonschema.Draft201909Validator,
            jsonschema.Draft202012Validator,
        )
    }


def _unresolvable() -> type[referencing.exceptions.Unresolvable]:
    """The error for a ``$ref`` that cannot be resolved (an ``except`` clause evaluates this only
    when an exception is on its way, so referencing is imported only then)."""
    import referencing.exceptions

    return referencing.exceptions.Unresolvable


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """Whether a result has the declared shape."""

    ok: bool
    """True when every check passed (or none was asked for)."""
    value: object | None
    """The validated value: the pydantic model instance when a model was given (so the coerced
    form is what is handed on), else the JSON value itself. None when ``ok`` is False: a value
    that did not validate is never handed on."""
    errors: tuple[str, ...] = ()
    """One line per problem, each starting with the JSON path (``$.rows[3].rate: ...``)."""


# --------------------------------------------------------------------------------------------
# Finding the result


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> object:
    """Strict JSON: NaN and Infinity are errors (see the module docstring)."""
    return cast(object, json.loads(text, parse_constant=_refuse_constant))


def _parse_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return str(exc)


def extract_result(
    stdout: str, result_file_bytes: bytes | None
) -> tuple[object | None, str | None]:
    """Find the declared result of a run.

    Args:
        stdout: The run's standard output.
        result_file_bytes: The content of the result file (``result.json``) when the run
            exported one; it then wins over stdout.

    Returns:
        ``(value, None)`` when a result was found, or ``(None, reason)`` with a sentence saying
        why none was (and how to declare one).

    Without a result file, the result is the last non-empty line of stdout that parses as a JSON
    object or array (so log lines before and after it do no harm), or failing that the whole of
    stdout, if it parses as JSON (a pretty-printed object, or a bare number).
    """
    if result_file_bytes is not None:
        try:
            # utf-8-sig: a byte order mark, which some editors and libraries write, is not an error.
            text = result_file_bytes.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return None, f"the result file is not UTF-8 text ({exc.reason} at byte {exc.start})"
        try:
            return _loads(text), None
        except (ValueError, RecursionError) as exc:
            return None, f"the result file is not valid JSON: {_parse_error(exc)}"

    if not stdout.strip():
        return None, (
            "no result: stdout is empty and no result file was written; print the result as "
            "JSON on the last line of stdout, or write it to the result file"
        )
    for line in reversed(stdout.splitlines()):
        candidate = line.strip()
        # Only lines that look like an object or an array are parsed: a last line "done" or
        # "42" after the real result is log output, not the result.
        if not candidate or candidate[0] not in "{[":
            continue
        try:
            value = _loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict | list):
            return value, None
    try:
        return _loads(stdout), None
    except (ValueError, RecursionError) as exc:
        last_error = _parse_error(exc)
    return None, (
        "no result: no line of stdout is a JSON object or array, and the whole of stdout is not "
        f"JSON either ({last_error}); print the result with json.dumps on the last line of "
        "stdout, or write it to the result file"
    )


# --------------------------------------------------------------------------------------------
# Checking it


def json_path(parts: Iterable[object]) -> str:
    """``$.rows[3].rate`` for the path ``rows, 3, rate``; odd keys are quoted (``$["a b"]``)."""
    out = ["$"]
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out.append(f"[{part}]")
        elif isinstance(part, str) and _IDENTIFIER.match(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(str(part), ensure_ascii=True)}]")
    return "".join(out)


def _shorten(message: str) -> str:
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    return message[: _MAX_MESSAGE_CHARS - 1] + "…"


def capped_errors(lines: Iterable[str]) -> tuple[str, ...]:
    """At most :data:`MAX_ERRORS` lines, the last one saying so if more were left out."""
    first = list(itertools.islice(lines, MAX_ERRORS + 1))
    if len(first) <= MAX_ERRORS:
        return tuple(first)
    kept = first[: MAX_ERRORS - 1]
    return (*kept, f"... more errors not shown (only the first {len(kept)} are listed)")


def _validator_class(schema: Mapping[str, object]) -> Any:  # jsonschema is untyped
    import jsonschema

    declared = schema.get("$schema")
    dialects = _dialects()
    if declared is None:
        return jsonschema.Draft202012Validator
    if not isinstance(declared, str) or declared.rstrip("#") not in dialects:
        raise ConfigError(
            f"invalid JSON Schema: unknown $schema {declared!r}; use one of "
            f"{', '.join(sorted(dialects))}, or leave $schema out for 2020-12"
        )
    return dialects[declared.rstrip("#")]


def check_schema(schema: Mapping[str, object]) -> None:
    """Check that ``schema`` is a valid JSON Schema; call it when the request is made.

    Raises:
        ConfigError: with the reason and where in the schema it is.
    """
    if not isinstance(schema, Mapping):
        raise ConfigError(
            f"invalid JSON Schema: it must be a JSON object, got {type(schema).__name__}"
        )
    import jsonschema

    cls = _validator_class(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = json_path(exc.absolute_path)
        raise ConfigError(f"invalid JSON Schema at {where}: {_shorten(exc.message)}") from None
    except RecursionError:
        raise ConfigError("invalid JSON Schema: it is nested too deeply") from None


def load_schema(path: Path) -> Mapping[str, object]:
    """Read and check a JSON Schema file (``sandcell run --schema FILE``).

    Raises:
        ConfigError: naming the file, when it cannot be read, is not JSON or is not a valid
            schema.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"schema file {str(path)!r} cannot be read: {exc}") from None
    try:
        schema = _loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(
            f"schema file {str(path)!r} is not valid JSON: {_parse_error(exc)}"
        ) from None
    if not isinstance(schema, dict):
        raise ConfigError(
            f"schema file {str(path)!r} must hold a JSON object, got {type(schema).__name__}"
        )
    try:
        check_schema(schema)
    except ConfigError as exc:
        raise ConfigError(f"schema file {str(path)!r}: {exc}") from None
    return cast(Mapping[str, object], schema)


def _schema_error_lines(value: object, schema: Mapping[str, object]) -> Iterator[str]:
    """The schema's complaints about ``value``, lazily: only the first few are ever read."""
    check_schema(schema)
    cls = _validator_class(schema)
    # Formats (date, email, ipv4, uuid...) are checked, not only annotations: whoever writes
    # "format": "date" in a result schema means it.
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return (
        f"{json_path(error.absolute_path)}: {_shorten(str(error.message))}"
        for error in validator.iter_errors(value)
    )


def _model_errors(
    value: object, model: type[pydantic.BaseModel]
) -> tuple[pydantic.BaseModel | None, tuple[str, ...]]:
    import pydantic  # only when a model is given: pydantic is not a dependency of sandcell

    try:
        return model.model_validate(value), ()
    except pydantic.ValidationError as exc:
        details: Sequence[Mapping[str, object]] = cast(
            Sequence[Mapping[str, object]], exc.errors(include_url=False)
        )
        loc_and_msg = (
            (cast(Sequence[object], d.get("loc", ())), str(d.get("msg", ""))) for d in details
        )
        return None, tuple(f"{json_path(loc)}: {_shorten(msg)}" for loc, msg in loc_and_msg)
    except Exception as exc:  # a validator of the caller's model failed in an unplanned way
        return None, (f"$: the model {model.__name__} raised {type(exc).__name__}: {exc}",)


def validate_result(
    value: object,
    *,
    schema: Mapping[str, object] | None = None,
    model: type[pydantic.BaseModel] | None = None,
) -> ValidationReport:
    """Check a result against a JSON Schema, a pydantic model, or both.

    With neither, the result is accepted as it is. With both, both must pass, and the value
    handed on is the model instance.

    Raises:
        ConfigError: when the schema itself is invalid (also checked by :func:`check_schema`,
            which callers should run when the request is made, before anything runs).
    """
    sources: list[Iterable[str]] = []
    validated: object = value
    try:
        if schema is not None:
            sources.append(_schema_error_lines(value, schema))
        if model is not None:
            instance, model_errors = _model_errors(value, model)
            sources.append(model_errors)
            validated = instance
        errors = capped_errors(itertools.chain.from_iterable(sources))
    except _unresolvable() as exc:
        # No $ref is ever fetched from the network or the disk: a schema must be self-contained.
        raise ConfigError(
            f"invalid JSON Schema: $ref {exc.ref!r} cannot be resolved; schemas must be "
            "self-contained (use $defs), nothing is fetched"
        ) from None
    except RecursionError:
        errors = ("$: the result is nested too deeply to be validated",)
    if errors:
        return ValidationReport(ok=False, value=None, errors=errors)
    return ValidationReport(ok=True, value=validated, errors=())
