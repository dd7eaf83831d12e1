"""What one benchmark run measured: frozen values, and their JSON form (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from _stats import Latency

__all__ = [
    "LatencyCell",
    "MemoryRow",
    "Results",
    "ThroughputCell",
    "VariantInfo",
    "results_from_dict",
    "results_to_dict",
]

KIB_PER_MIB = 1024


@dataclass(frozen=True, slots=True)
class VariantInfo:
    """One contender: what it is, what it isolates, and whether it could run here."""

    key: str
    label: str
    isolation: str
    """What separates a run from the caller and from other runs, in a few words."""
    available: bool = True
    note: str = ""
    """Why it is not available, or what the reader must know to read its numbers."""


@dataclass(frozen=True, slots=True)
class LatencyCell:
    """Call-to-result latency of one variant on one workload."""

    variant: str
    workload: str
    latency: Latency | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ThroughputCell:
    """Completed runs in a fixed time with ``concurrency`` callers running back to back."""

    variant: str
    workload: str
    concurrency: int
    runs: int
    seconds: float
    error: str | None = None

    @property
    def runs_per_s(self) -> float | None:
        if self.error is not None or self.seconds <= 0:
            return None
        return self.runs / self.seconds


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """Idle memory (PSS) of ready-to-run sandboxes or interpreters."""

    label: str
    sandboxes: int
    """How many ready sandboxes or interpreters the measured processes hold."""
    processes: int
    total_kib: int | None
    note: str = ""

    @property
    def per_sandbox_mib(self) -> float | None:
        if self.total_kib is None or self.sandboxes <= 0:
            return None
        return self.total_kib / KIB_PER_MIB / self.sandboxes


@dataclass(frozen=True, slots=True)
class Results:
    meta: Mapping[str, str]
    variants: tuple[VariantInfo, ...]
    workloads: Mapping[str, str]
    """Workload name to the code every variant ran."""
    latency: tuple[LatencyCell, ...] = ()
    throughput: tuple[ThroughputCell, ...] = ()
    memory: tuple[MemoryRow, ...] = ()
    baseline: str = "python"
    """The variant every ratio divides by."""

    def latency_of(self, variant: str, workload: str) -> LatencyCell | None:
        return next(
            (c for c in self.latency if c.variant == variant and c.workload == workload), None
        )

    def throughput_of(self, variant: str, workload: str, concurrency: int) -> ThroughputCell | None:
        return next(
            (
                c
                for c in self.throughput
                if c.variant == variant and c.workload == workload and c.concurrency == concurrency
            ),
            None,
        )


def results_to_dict(results: Results) -> dict[str, Any]:
    """The JSON form: every measured value, plus the derived rates and ratios a reader wants."""
    base = results.baseline
    latency = []
    for c in results.latency:
        row: dict[str, Any] = asdict(c)
        b = results.latency_of(base, c.workload)
        if c.latency is not None and b is not None and b.latency is not None:
            row["median_over_baseline"] = c.latency.median_ms / b.latency.median_ms
        latency.append(row)
    throughput = []
    for t in results.throughput:
        row = asdict(t)
        row["runs_per_s"] = t.runs_per_s
        bt = results.throughput_of(base, t.workload, t.concurrency)
        if t.runs_per_s is not None and bt is not None and bt.runs_per_s:
            row["rate_over_baseline"] = t.runs_per_s / bt.runs_per_s
        throughput.append(row)
    memory = []
    for m in results.memory:
        row = asdict(m)
        row["per_sandbox_mib"] = m.per_sandbox_mib
        memory.append(row)
    return {
        "meta": dict(results.meta),
        "baseline": base,
        "workloads": dict(results.workloads),
        "variants": [asdict(v) for v in results.variants],
        "latency": latency,
        "throughput": throughput,
        "memory": memory,
    }


def results_from_dict(d: Mapping[str, Any]) -> Results:
    """Back from :func:`results_to_dict` (derived values are recomputed, not read)."""

    def lat(x: Mapping[str, Any] | None) -> Latency | None:
        return None if x is None else Latency(**x)

    return Results(
        meta=dict(d["meta"]),
        variants=tuple(VariantInfo(**v) for v in d["variants"]),
        workloads=dict(d["workloads"]),
        latency=tuple(
            LatencyCell(c["variant"], c["workload"], lat(c["latency"]), c["error"])
            for c in d["latency"]
        ),
        throughput=tuple(
            ThroughputCell(
                t["variant"], t["workload"], t["concurrency"], t["runs"], t["seconds"], t["error"]
            )
            for t in d["throughput"]
        ),
        memory=tuple(
            MemoryRow(m["label"], m["sandboxes"], m["processes"], m["total_kib"], m["note"])
            for m in d["memory"]
        ),
        baseline=d["baseline"],
    )
