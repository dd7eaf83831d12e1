"""Arguments against a tool's JSON Schema (an MCP tool's ``inputSchema``), with ``jsonschema``.

``jsonschema`` is a core dependency of sandcell already. It is given an empty reference
registry: a ``$ref`` to anything outside the schema itself fails the check instead of being
fetched, so a schema can never make the host reach the network.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

# jsonschema and referencing have no type information: imported by name so values are Any.
_validators = importlib.import_module("jsonschema.validators")
_exceptions = importlib.import_module("jsonschema.exceptions")
_referencing = importlib.import_module("referencing")


def schema_problem(schema: Mapping[str, object]) -> str | None:
    """Why ``schema`` is not a usable JSON Schema; None when it is."""
    try:
        _validators.validator_for(schema).check_schema(schema)
    except _exceptions.SchemaError as exc:
        return str(exc.message)
    return None


def argument_problem(schema: Mapping[str, object], args: Mapping[str, object]) -> str | None:
    """The first way ``args`` break ``schema`` (with where), or None when they fit."""
    cls = _validators.validator_for(schema)
    validator = cls(dict(schema), registry=_referencing.Registry())
    try:
        error = next(iter(validator.iter_errors(dict(args))), None)
    except Exception as exc:  # an unresolvable $ref, a pathological pattern: fail closed
        return f"the arguments cannot be checked: {type(exc).__name__}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
    message = str(error.message)
    return f"{where}: {message[:300]}"
