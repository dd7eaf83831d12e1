"""Pure statistics for the benchmarks: latency summaries and ratios (no I/O, no sandcell)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Latency", "latency_stats", "p90", "ratio"]


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency sample summarised, in milliseconds."""

    n: int
    median_ms: float
    p90_ms: float
    min_ms: float


def p90(xs: Sequence[float]) -> float:
    """The 90th percentile, interpolated between samples (inclusive method: stays within them)."""
    if not xs:
        raise ValueError("p90 of no samples: measure at least one run")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def latency_stats(samples_ms: Sequence[float]) -> Latency:
    if not samples_ms:
        raise ValueError("no latency samples: measure at least one run")
    return Latency(
        n=len(samples_ms),
        median_ms=statistics.median(samples_ms),
        p90_ms=p90(samples_ms),
        min_ms=min(samples_ms),
    )


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing or the baseline is zero."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline
