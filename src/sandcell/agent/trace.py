"""Traceability: every number the final answer states must come out of a run.

A number in the explanation or in a figure is *traced* when some successful run printed it (its
stdout, its displayed values, or its declared result) at least as precisely as the answer states
it. Formats are normalised: ``1,234.50`` is 1234.5, ``7.2%`` matches a printed ``7.2`` or
``0.072`` (and a printed ``7.23%`` matches ``0.0723``), and a stated number matches any printed
value that rounds to it at the shown precision (``7.2`` matches ``7.2341``; ``7.24`` does not).
Dates (``2026-11-05``) must appear as written.

What is not a claim: numbers inside identifiers and file names (``fig1.png``, ``float64``,
``3f2a9c``), markdown list markers at the start of a line, references such as ``run 2`` or
``attempt 3``, and numbers that are already in the question.

Limitations: signs are compared loosely (``fell by 5%`` matches a printed ``-5``), a number
spelled out in words (``seven``) is not seen, and a claim that merely rounds to some unrelated
printed value is accepted: the check proves a number came from a run's output, not that the
sentence around it describes that output correctly.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sandcell.agent.protocol import FigureClaim, FinalAnswer

__all__ = [
    "Evidence",
    "Number",
    "TraceReport",
    "find_dates",
    "find_numbers",
    "trace_answer",
    "trace_prose",
]

_NUMBER = re.compile(
    r"""
    (?<![\w.])                                   # not inside a word, nor after a decimal point
    (?P<sign>[-+\u2212])?
    (?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)
    (?P<exp>[eE][-+]?\d+)?
    (?!\d)
    (?P<pct>[ \u00a0]?%)?
    (?P<tail>[A-Za-z_][A-Za-z0-9_]*)?
    """,
    re.VERBOSE,
)
_DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
_LIST_MARKER = re.compile(r"^([ \t]*(?:[-*][ \t]+)?)\d+[.)](?=[ \t])", re.MULTILINE)
_REFERENCE = re.compile(r"\b(?:runs?|attempts?|steps?)[ \t]+#?\d+\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Number:
    """A number as written in text."""

    text: str
    value: Decimal
    """Its magnitude (the sign is not compared), before any percent scaling."""
    decimals: int
    """Shown precision: digits after the point (negative for ``1.2e3``)."""
    percent: bool

    def candidates(self) -> tuple[tuple[Decimal, int], ...]:
        """The values (with precision) this number may stand for: 7.2% is 7.2 or 0.072."""
        if self.percent:
            return ((self.value, self.decimals), (self.value / 100, self.decimals + 2))
        return ((self.value, self.decimals),)


def _number(m: re.Match[str]) -> Number | None:
    tail = m.group("tail")
    if tail and any(c.isdigit() or c == "_" for c in tail):
        return None  # an identifier such as a hex id, not a quantity
    raw = m.group("num").replace(",", "") + (m.group("exp") or "")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return None
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):
        return None
    return Number(
        text=m.group(0).strip(), value=abs(value), decimals=-exponent, percent=bool(m.group("pct"))
    )


def find_numbers(text: str) -> list[Number]:
    """Every number in ``text`` (dates split into their parts; see :func:`find_dates`)."""
    found = (_number(m) for m in _NUMBER.finditer(text))
    return [n for n in found if n is not None]


def find_dates(text: str) -> list[str]:
    """ISO dates (``2026-11-05``) in ``text``."""
    return _DATE.findall(text)


def _claims(text: str) -> tuple[list[Number], list[str]]:
    """The numbers and dates ``text`` states, without the ones that are not claims."""
    dates = find_dates(text)
    text = _DATE.sub(" ", text)
    text = _LIST_MARKER.sub(r"\1 ", text)
    text = _REFERENCE.sub(" ", text)
    return find_numbers(text), dates


class _Values:
    """The numbers of one source, sorted for range lookups."""

    def __init__(self, numbers: Iterable[Number]) -> None:
        values: set[Decimal] = set()
        for n in numbers:
            values.add(n.value)
            if n.percent:
                values.add(n.value / 100)
        self._sorted = sorted(values)

    def has(self, value: Decimal, decimals: int) -> bool:
        # Inclusive at both ends: a half-way value rounds either way, as printers differ.
        tolerance = Decimal(5) * Decimal(10) ** (-decimals - 1)
        i = bisect.bisect_left(self._sorted, value - tolerance)
        return i < len(self._sorted) and self._sorted[i] <= value + tolerance


@dataclass(frozen=True, slots=True)
class _Source:
    values: _Values
    text: str


class Evidence:
    """What the runs produced, by run id, plus the question (its numbers are not claims)."""

    def __init__(self, runs: Mapping[str, Sequence[str]], *, context: str = "") -> None:
        self._runs = {
            run_id: _Source(_Values(n for t in texts for n in find_numbers(t)), "\n".join(texts))
            for run_id, texts in runs.items()
        }
        self._context = _Source(_Values(find_numbers(context)), context)

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(self._runs)

    def find(self, number: Number, run_id: str | None = None) -> str | None:
        """The run that printed ``number`` (``run_id`` only, when given); ``"question"`` when
        the question itself states it; None when nothing does."""
        if run_id is None and any(self._context.values.has(v, d) for v, d in number.candidates()):
            return "question"
        for rid, source in self._runs.items():
            if run_id is not None and rid != run_id:
                continue
            if any(source.values.has(v, d) for v, d in number.candidates()):
                return rid
        return None

    def find_date(self, date: str, run_id: str | None = None) -> str | None:
        if run_id is None and date in self._context.text:
            return "question"
        for rid, source in self._runs.items():
            if (run_id is None or rid == run_id) and date in source.text:
                return rid
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceReport:
    untraced: tuple[str, ...]
    """Each number no run produced, said for the model (``'7.5%' in the explanation``)."""
    figure_runs: tuple[str | None, ...]
    """For each figure, the run it was traced to."""

    @property
    def ok(self) -> bool:
        return not self.untraced


def trace_answer(
    answer: FinalAnswer, evidence: Evidence, *, resolve_run: Callable[[str], str | None]
) -> TraceReport:
    """Trace every number of ``answer`` to ``evidence``.

    ``resolve_run`` turns a figure's ``run`` reference (attempt number or run id) into the id of
    a successful run, or None when it names none.
    """
    untraced: list[str] = []
    numbers, dates = _claims(answer.explanation)
    for n in numbers:
        if evidence.find(n) is None:
            untraced.append(f"{n.text!r} in the explanation")
    for d in dates:
        if evidence.find_date(d) is None:
            untraced.append(f"{d!r} in the explanation")
    figure_runs: list[str | None] = []
    for fig in answer.figures:
        run_id: str | None = None
        if fig.run is not None:
            run_id = resolve_run(fig.run)
            if run_id is None:
                untraced.append(
                    f"figure {fig.name!r} refers to run {fig.run!r}, which is not a successful run"
                )
                figure_runs.append(None)
                continue
        found, problems = _trace_figure(fig, evidence, run_id)
        untraced += problems
        figure_runs.append(found)
    return TraceReport(untraced=tuple(untraced), figure_runs=tuple(figure_runs))


def trace_prose(text: str, evidence: Evidence) -> tuple[int, tuple[str, ...]]:
    """Trace the numbers and dates of an answer written as prose.

    Returns how many of them a run printed (those the question states do not count: a reply
    that only repeats the question answers nothing) and each that nothing printed.
    """
    numbers, dates = _claims(text)
    from_runs = 0
    untraced: list[str] = []
    for n in numbers:
        found = evidence.find(n)
        from_runs += found not in (None, "question")
        if found is None:
            untraced.append(f"{n.text!r}")
    for d in dates:
        found = evidence.find_date(d)
        from_runs += found not in (None, "question")
        if found is None:
            untraced.append(f"{d!r}")
    return from_runs, tuple(untraced)


def _trace_figure(
    fig: FigureClaim, evidence: Evidence, run_id: str | None
) -> tuple[str | None, list[str]]:
    where = f"the output of run {run_id}" if run_id else "any run's output"
    problems: list[str] = []
    found: str | None = None
    if fig.number is not None:
        exponent = fig.number.as_tuple().exponent
        number = Number(
            text=fig.shown,
            value=abs(fig.number),
            decimals=-exponent if isinstance(exponent, int) else 0,
            percent=fig.unit.strip() == "%",
        )
        found = evidence.find(number, run_id)
        if found is None:
            problems.append(f"figure {fig.name!r} = {fig.shown} is not in {where}")
    else:
        numbers, dates = _claims(fig.shown)
        for n in numbers:
            hit = evidence.find(n, run_id)
            found = found or hit
            if hit is None:
                problems.append(f"figure {fig.name!r}: {n.text!r} is not in {where}")
        for d in dates:
            hit = evidence.find_date(d, run_id)
            found = found or hit
            if hit is None:
                problems.append(f"figure {fig.name!r}: {d!r} is not in {where}")
    for n in _claims(fig.name)[0]:
        if evidence.find(n) is None:
            problems.append(f"{n.text!r} in the name of figure {fig.name!r}")
    return (found if found != "question" else None), problems
