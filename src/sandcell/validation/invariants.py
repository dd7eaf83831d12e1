"""Invariants: facts the caller knows must hold of a result (a rate between 0 and 100).

Two forms:

* From Python, any callable ``(value) -> bool``. It is the caller's own code and runs as it is;
  an exception inside it is a failed invariant, reported with the exception's text.
* From the command line, a small expression over ``result``::

      sandcell run --invariant '0 <= result["rate"] <= 100' ...
      --invariant 'all(r["n"] >= 0 for r in result["rows"])'
      --invariant 'len(result["rows"]) == result["count"]'

  The expression is parsed with :mod:`ast` and every node is checked against a whitelist
  before anything is evaluated; it is then evaluated by the small interpreter below, never by
  :func:`eval`. The result is untrusted data, so the language has no attribute access (no
  ``result.__class__`` escapes), no calls except a few pure built-ins, no names except
  ``result`` and comprehension variables, no string repetition, and bounds on everything an
  evaluation can spend: a step budget (scans, copies and joins are charged by their length), a
  CPU-time budget (:data:`MAX_CPU_SECONDS`), integers of at most :data:`MAX_INT_BITS` bits and
  joined strings and lists of at most :data:`MAX_BUILT_LENGTH` items. An invariant cannot be
  turned into a way out or a way to hang the host, whatever the result. (A service runs textual
  invariants in a separate, limited process besides: :mod:`sandcell.validation.confined`.)

The expression language
-----------------------
* literals: numbers, strings, ``True``, ``False``, ``None``, lists and tuples of expressions;
* ``result``, and the variables of comprehensions (``for r in result["rows"]``; a name or a
  tuple of names);
* subscripts with a constant key or index (``result["rows"][0]``, ``result["xs"][-1]``) and
  slices with constant bounds (``result["xs"][:3]``);
* comparisons (``== != < <= > >= in not in``; ``is``/``is not`` only with ``None``, ``True``,
  ``False``), ``and``, ``or``, ``not``, unary ``-``/``+``;
* arithmetic ``+ - * / // %`` (``*`` and ``%`` on numbers only);
* calls to ``len abs min max sum all any isinstance``; ``isinstance`` takes one of
  ``int float str list dict bool`` or a tuple of them. As in JSON, ``True`` and ``False`` are not
  ``int`` here;
* generator expressions and list comprehensions, with ``if`` filters.

An invariant holds only if it evaluates to exactly ``True``; any other value, or an error while
evaluating it (a missing key, a division by zero), is a failure that says why.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from sandcell.errors import ConfigError
from sandcell.validation._invariant_lang import (
    MAX_BUILT_LENGTH,
    MAX_CPU_SECONDS,
    MAX_INT_BITS,
    MAX_SOURCE_CHARS,
    MAX_STEPS,
    Failure,
    Interpreter,
    check,
)

__all__ = [
    "MAX_BUILT_LENGTH",
    "MAX_CPU_SECONDS",
    "MAX_INT_BITS",
    "MAX_STEPS",
    "Invariant",
    "InvariantLike",
    "check_invariants",
    "invariant_failure",
    "parse_invariant",
]


@dataclass(frozen=True, slots=True)
class Invariant:
    """A checked textual invariant; build it with :func:`parse_invariant`."""

    source: str
    """The expression as the caller wrote it; failures are reported under it."""
    tree: ast.expr = field(repr=False, compare=False)

    def __call__(self, value: object) -> object:
        """Evaluate on ``value``; raises on errors (a missing key), like a Python callable."""
        return Interpreter(value).eval(self.tree, {})


InvariantLike: TypeAlias = Invariant | Callable[[object], object] | str
"""What :func:`check_invariants` accepts: a parsed invariant, a Python callable, or the text of
one (parsed on the spot)."""


def parse_invariant(source: str) -> Invariant:
    """Parse and check a textual invariant, at request time, before anything runs.

    Raises:
        ConfigError: for a syntax error or any construct outside the language, naming it.
    """
    if len(source) > MAX_SOURCE_CHARS:
        raise ConfigError(
            f"invariant is {len(source)} characters long, over the {MAX_SOURCE_CHARS} allowed"
        )
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"invariant {source!r} is not a valid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"invariant {source!r} is nested too deeply") from None
    try:
        check(tree.body, source, frozenset())
    except RecursionError:
        raise ConfigError(f"invariant {source!r} is nested too deeply") from None
    return Invariant(source=source, tree=tree.body)


# --------------------------------------------------------------------------------------------
# Checking a result


def _name(invariant: object, position: int) -> str:
    if isinstance(invariant, Invariant):
        return repr(invariant.source)
    # Callables are named by position too: two lambdas would otherwise read the same.
    name = getattr(invariant, "__name__", None)
    return f"#{position} ({name if name else type(invariant).__name__})"


def check_invariants(
    value: object,
    invariants: Sequence[InvariantLike],
) -> tuple[str, ...]:
    """Check every invariant on ``value``; return the failures, each naming its invariant.

    Strings are parsed with :func:`parse_invariant` first (so an invalid one raises
    :class:`~sandcell.errors.ConfigError`; parse them at request time to find out before the
    run). An empty tuple means every invariant holds.
    """
    compiled = [parse_invariant(i) if isinstance(i, str) else i for i in invariants]
    failures = (
        invariant_failure(value, invariant, position)
        for position, invariant in enumerate(compiled, start=1)
    )
    return tuple(failure for failure in failures if failure is not None)


def invariant_failure(
    value: object, invariant: Invariant | Callable[[object], object], position: int
) -> str | None:
    """Why ``invariant`` (the ``position``-th, counted from 1) does not hold of ``value``, or
    None when it holds."""
    name = _name(invariant, position)
    try:
        outcome = invariant(value)
    except Failure as exc:
        return f"invariant {name} could not be evaluated: {exc}"
    except Exception as exc:  # the caller's own callable, or a type error in a comparison
        return f"invariant {name} raised {type(exc).__name__}: {exc}"
    if outcome is True:
        return None
    if outcome is False:
        return f"invariant {name} does not hold"
    shown = repr(outcome)
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    return f"invariant {name} gave {shown} ({type(outcome).__name__}), not True or False"
