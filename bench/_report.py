"""Tables from benchmark results, as aligned text for the terminal or Markdown for the README.

Pure: builds strings from :class:`_results.Results`, never measures or writes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from _results import Results
from _stats import ratio

__all__ = [
    "Table",
    "fmt_ratio",
    "latency_table",
    "memory_table",
    "render",
    "render_report",
    "targets_table",
    "throughput_table",
    "variants_table",
]

MISSING = "-"


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    left: frozenset[int] = frozenset({0})
    """Columns of words, aligned left; the others hold numbers and align right."""


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return MISSING
    return f"{r:.2f}x" if r < 100 else f"{r:.0f}x"


def _fmt_ms(ms: float) -> str:
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def _fmt_rate(rate: float) -> str:
    return f"{rate:.1f}" if rate < 1000 else f"{rate:.0f}"


def variants_table(results: Results) -> Table:
    rows = tuple(
        (v.key, v.label, v.isolation, "yes" if v.available else f"not available: {v.note}")
        for v in results.variants
    )
    notes = tuple(f"{v.key}: {v.note}" for v in results.variants if v.available and v.note)
    headers = ("key", "what", "isolation", "measured")
    return Table("Variants", headers, rows, notes, frozenset(range(len(headers))))


def latency_table(results: Results) -> Table:
    """Median (p90) per workload, and the median as a multiple of the baseline's."""
    measured = {c.workload for c in results.latency}
    workloads = tuple(w for w in results.workloads if w in measured)
    headers: list[str] = ["variant"]
    for w in workloads:
        headers += [f"{w} median (p90) ms", f"{w} vs {results.baseline}"]
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for v in results.variants:
        if not v.available:
            continue
        row = [v.key]
        for w in workloads:
            cell = results.latency_of(v.key, w)
            base = results.latency_of(results.baseline, w)
            if cell is None:
                row += [MISSING, MISSING]
            elif cell.error is not None or cell.latency is None:
                row += ["failed", MISSING]
                notes.append(f"{v.key} / {w}: {cell.error}")
            else:
                lat = cell.latency
                b = base.latency.median_ms if base is not None and base.latency else None
                row += [
                    f"{_fmt_ms(lat.median_ms)} ({_fmt_ms(lat.p90_ms)})",
                    fmt_ratio(ratio(lat.median_ms, b)),
                ]
        rows.append(tuple(row))
    ns = {c.latency.n for c in results.latency if c.latency is not None}
    samples = f"{min(ns)}-{max(ns)} samples per cell" if ns else "no samples"
    title = f"Latency, call to result ({samples}; lower is better)"
    return Table(title, tuple(headers), tuple(rows), tuple(notes))


def throughput_table(results: Results) -> Table:
    """Runs per second per workload and concurrency; the rate as a multiple of the baseline's."""
    keys = sorted({(t.workload, t.concurrency) for t in results.throughput})
    order = list(results.workloads)
    keys.sort(key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[1]))
    headers = ("variant", *(f"{w} c={c}" for w, c in keys))
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for v in results.variants:
        if not v.available:
            continue
        row = [v.key]
        for w, c in keys:
            cell = results.throughput_of(v.key, w, c)
            base = results.throughput_of(results.baseline, w, c)
            rate = cell.runs_per_s if cell is not None else None
            if cell is None:
                row.append(MISSING)
            elif rate is None:
                row.append("failed")
                notes.append(f"{v.key} / {w} c={c}: {cell.error}")
            else:
                r = ratio(rate, base.runs_per_s if base is not None else None)
                row.append(f"{_fmt_rate(rate)} ({fmt_ratio(r)})")
        rows.append(tuple(row))
    title = (
        f"Throughput, runs/s with c callers back to back (vs {results.baseline} at the same c; "
        "higher is better)"
    )
    return Table(title, headers, tuple(rows), tuple(notes))


def _best_rate(results: Results, workload: str, c: int, keys: Sequence[str]) -> tuple[str, float]:
    rates = [(k, t.runs_per_s) for k in keys if (t := results.throughput_of(k, workload, c))]
    return max(((k, r) for k, r in rates if r is not None), key=lambda x: x[1], default=("", 0.0))


def targets_table(
    results: Results, *, warm_ms: float = 3.0, rate_x: float = 2.0, cold_x: float = 1.10
) -> Table:
    """The issue's targets against what this run measured (only those it measured)."""
    rows: list[tuple[str, str, str]] = []
    for workload in ("noop", "cpu"):
        cold = results.latency_of("sandcell-cold", workload)
        bare = results.latency_of("bwrap", workload)
        if cold and bare and cold.latency is not None and bare.latency is not None:
            c_ms, b_ms = cold.latency.median_ms, bare.latency.median_ms
            r = c_ms / b_ms
            what = f"sandcell-cold: {workload} median <= {cold_x:.2f}x bare bubblewrap's"
            got = f"{fmt_ratio(r)} ({c_ms:.1f} vs {b_ms:.1f} ms)"
            rows.append((what, got, "yes" if r <= cold_x else "no"))
    warm = [v.key for v in results.variants if v.available and v.key.startswith("sandcell-")]
    for key in (k for k in warm if k != "sandcell-cold"):
        cell = results.latency_of(key, "pandas")
        if cell is not None and cell.latency is not None:
            med = cell.latency.median_ms
            ok = "yes" if med <= warm_ms else "no"
            rows.append((f"{key}: pandas snippet median <= {warm_ms:g} ms", f"{med:.1f} ms", ok))
    base = results.baseline
    for workload in ("noop", "cpu"):
        for c in sorted({t.concurrency for t in results.throughput if t.workload == workload}):
            b = results.throughput_of(base, workload, c)
            key, rate = _best_rate(results, workload, c, warm)
            r = ratio(rate, b.runs_per_s if b is not None else None)
            if not key or r is None:
                continue
            what = f"fresh sandboxes, {workload} at c={c}: > {rate_x:g}x {base}'s rate"
            got = f"{fmt_ratio(r)} ({key}, {_fmt_rate(rate)}/s)"
            rows.append((what, got, "yes" if r > rate_x else "no"))
    interp = next((m for m in results.memory if m.label.startswith("separate")), None)
    for m in results.memory:
        per, ref = m.per_sandbox_mib, interp.per_sandbox_mib if interp else None
        if m is interp or per is None or ref is None:
            continue
        what = f"{m.label}: idle PSS per ready sandbox below half a separate interpreter's"
        got = f"{per:.1f} MiB vs {ref:.1f} MiB ({fmt_ratio(per / ref)})"
        rows.append((what, got, "yes" if per < ref / 2 else "no"))
    return Table("Targets of issue 5", ("target", "measured", "met"), tuple(rows))


def memory_table(results: Results) -> Table:
    rows = []
    for m in results.memory:
        total = MISSING if m.total_kib is None else f"{m.total_kib / 1024:.1f}"
        per = m.per_sandbox_mib
        rows.append(
            (
                m.label,
                str(m.sandboxes),
                str(m.processes),
                total,
                MISSING if per is None else f"{per:.1f}",
                m.note,
            )
        )
    headers = ("idle", "ready sandboxes", "processes", "PSS total MiB", "PSS per ready MiB", "note")
    title = "Idle memory (PSS from /proc/PID/smaps_rollup)"
    return Table(title, headers, tuple(rows), left=frozenset({0, len(headers) - 1}))


def render(table: Table, *, markdown: bool) -> str:
    """One table as Markdown (pipes) or aligned text (first column left, the rest right)."""
    if markdown:
        lines = [f"**{table.title}**", ""]
        lines.append("| " + " | ".join(table.headers) + " |")
        rule = [":---" if i in table.left else "---:" for i in range(len(table.headers))]
        lines.append("|" + "|".join(rule) + "|")
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table.rows]
        if table.notes:
            lines += ["", *(f"- {n}" for n in table.notes)]
        return "\n".join(lines) + "\n"
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [f"== {table.title}", _line(table.headers, widths, table.left)]
    lines.append("  ".join("-" * w for w in widths))
    lines += [_line(row, widths, table.left) for row in table.rows]
    lines += [f"  * {n}" for n in table.notes]
    return "\n".join(lines) + "\n"


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def _line(cells: Sequence[str], widths: Sequence[int], left: frozenset[int]) -> str:
    out = [
        c.ljust(w) if i in left else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(out).rstrip()


def render_report(results: Results, *, markdown: bool) -> str:
    """The whole report: when and where it ran, the variants, then every table that has rows."""
    head = [f"{k}: {v}" for k, v in results.meta.items()]
    if markdown:
        parts = ["### sandcell against the alternatives", ""]
        how = "Measured in one run by `.venv/bin/python bench/compare.py`; every ratio is against"
        parts += [f"{how} `{results.baseline}` measured in the same run.", ""]
        parts += [f"- {line}" for line in head]
        parts.append("")
    else:
        parts = ["sandcell against the alternatives", *head, ""]
    tables = [variants_table(results)]
    if results.latency:
        tables.append(latency_table(results))
    if results.throughput:
        tables.append(throughput_table(results))
    if results.memory:
        tables.append(memory_table(results))
    targets = targets_table(results)
    if targets.rows:
        tables.append(targets)
    workloads = Table(
        "Workloads",
        ("name", "code"),
        tuple((k, v.replace("\n", "; ")) for k, v in results.workloads.items()),
        left=frozenset({0, 1}),
    )
    tables.append(workloads)
    return "\n".join([*parts, *(render(t, markdown=markdown) for t in tables)])
