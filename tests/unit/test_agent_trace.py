"""Traceability: numbers in an answer matched to the runs' output, formats normalised."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sandcell.agent.protocol import FigureClaim, FinalAnswer
from sandcell.agent.trace import Evidence, find_numbers, trace_answer, trace_prose

RUN = "a" * 32
OTHER = "b" * 32


def _trace(
    explanation: str, stdout: str, *, question: str = "", figures: tuple[FigureClaim, ...] = ()
) -> tuple[str, ...]:
    evidence = Evidence({RUN: [stdout], OTHER: ["unrelated 99999"]}, context=question)
    refs = {"1": RUN, "2": OTHER}
    report = trace_answer(
        FinalAnswer(explanation=explanation, figures=figures),
        evidence,
        resolve_run=refs.get,
    )
    return report.untraced


@pytest.mark.parametrize(
    ("stated", "printed"),
    [
        ("1,234.50", "1234.5"),
        ("1,234.5", "total: 1234.50"),
        ("7.2%", "rate 7.2341"),
        ("7.2%", "rate 0.07234"),
        ("0.0723", "rate 7.23%"),
        ("7.23 %", "7.2299999"),
        ("7", "6.6"),
        ("-5%", "change: -0.05"),
        ("fell 5%", "change: -5.0"),
        ("1.2e-05", "p = 1.2e-05"),
        ("0.000012", "p = 1.2e-05"),
        ("13,375", "np.float64(13375.0)"),
        (".5", "0.5"),
        ("2026-11-05", "           2026-11-05    8.33"),
    ],
)
def test_formats_and_rounding_to_the_shown_precision_match(stated: str, printed: str) -> None:
    assert _trace(f"The figure is {stated}.", printed) == ()


@pytest.mark.parametrize(
    ("stated", "printed"),
    [
        ("7.24", "7.2341"),  # more precise than the output, and wrong at that precision
        ("7.5%", "rate 7.2341"),
        ("12", "1.2"),
        ("1,234.6", "1234.5"),
        ("2026-11-06", "2026-11-05"),
        ("42", "the answer is 41"),
    ],
)
def test_numbers_no_run_printed_are_caught(stated: str, printed: str) -> None:
    untraced = _trace(f"It was {stated} in the end.", printed)
    assert len(untraced) == 1 and "in the explanation" in untraced[0]


def test_identifiers_list_markers_and_run_references_are_not_claims() -> None:
    text = (
        "1. See out/fig1.png and run 3 (attempt 2, id 3f2a9c1b).\n"
        "2) The float64 column x_1 is clean.\n"
        "- 3. Nothing else."
    )
    assert _trace(text, "") == ()


def test_numbers_from_the_question_need_no_run() -> None:
    assert _trace("The top 3 days are listed.", "", question="Which are the top 3 days?") == ()


def test_a_figure_must_trace_to_the_run_it_names() -> None:
    fig = FigureClaim(name="rate", shown="6.60", number=Decimal("6.60"), unit="%", run="1")
    assert _trace("See the figure.", "mean: 6.600039", figures=(fig,)) == ()
    elsewhere = FigureClaim(name="rate", shown="6.60", number=Decimal("6.60"), unit="%", run="2")
    untraced = _trace("See the figure.", "mean: 6.600039", figures=(elsewhere,))
    assert untraced and f"run {OTHER}" in untraced[0]


def test_a_figure_naming_no_successful_run_is_untraced() -> None:
    fig = FigureClaim(name="rate", shown="1", number=Decimal(1), run="7")
    untraced = _trace("", "1", figures=(fig,))
    assert untraced and "not a successful run" in untraced[0]


def test_string_figures_and_figure_names_are_checked_too() -> None:
    day = FigureClaim(name="best day", shown="2026-11-05 (8.33%)", number=None)
    assert _trace("", "2026-11-05  8.33", figures=(day,)) == ()
    wrong = FigureClaim(name="rate on day 9", shown="8.33", number=Decimal("8.33"))
    untraced = _trace("", "2026-11-05  8.33", figures=(wrong,))
    assert untraced == ("'9' in the name of figure 'rate on day 9'",)


def test_find_numbers_reads_precision_and_percent() -> None:
    (n,) = find_numbers("about 1,234.50% of it")
    assert n.value == Decimal("1234.50") and n.decimals == 2 and n.percent
    (e,) = find_numbers("1.2e3")
    assert e.decimals == -2


def test_prose_counts_numbers_from_runs_and_names_the_untraced() -> None:
    evidence = Evidence({RUN: ["leads: 1388\nrate %: 6.772334"]}, context="sales in 2026")
    assert trace_prose("Of 1,388 leads, 6.77% converted.", evidence) == (2, ())
    # A number only the question states traces, but does not count as computed.
    assert trace_prose("Sales in 2026 were good.", evidence) == (0, ())
    assert trace_prose("6.77% of 1,400 leads converted.", evidence) == (1, ("'1,400'",))
