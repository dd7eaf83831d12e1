"""The benchmark suite's pure helpers: statistics, results, tables, /proc parsing, timing loops.

No timing assertions (speed lives in the benchmark itself), and nothing here needs the alternatives
(llm-sandbox, smolagents) installed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from _common import interleaved_latency, timed_pool  # noqa: E402
from _machine import descendants, parse_cpu_model, parse_pss_kib, pss_kib  # noqa: E402
from _report import (  # noqa: E402
    fmt_ratio,
    latency_table,
    render,
    render_report,
    targets_table,
)
from _results import (  # noqa: E402
    LatencyCell,
    MemoryRow,
    Results,
    ThroughputCell,
    VariantInfo,
    results_from_dict,
    results_to_dict,
)
from _stats import Latency, latency_stats, p90, ratio  # noqa: E402


def test_latency_stats_and_p90() -> None:
    s = latency_stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == Latency(n=5, median_ms=3.0, p90_ms=p90([1.0, 2.0, 3.0, 4.0, 5.0]), min_ms=1.0)
    assert 4.0 <= s.p90_ms <= 5.0
    assert p90([7.0]) == 7.0
    with pytest.raises(ValueError, match="no latency samples"):
        latency_stats([])


def test_ratio_handles_missing_values() -> None:
    assert ratio(6.0, 3.0) == 2.0
    assert ratio(None, 3.0) is None
    assert ratio(1.0, 0.0) is None
    assert fmt_ratio(None) == "-"
    assert fmt_ratio(2.0) == "2.00x"
    assert fmt_ratio(250.0) == "250x"


def _results() -> Results:
    variants = (
        VariantInfo("python", "bare python", "none"),
        VariantInfo("box", "a sandbox", "fresh per run", note="runs started as: cold 3"),
        VariantInfo("gone", "absent", "fresh per run", available=False, note="not installed"),
    )
    lat = (
        LatencyCell("python", "noop", latency_stats([10.0, 20.0, 30.0])),
        LatencyCell("box", "noop", latency_stats([40.0, 40.0, 40.0])),
        LatencyCell("python", "pandas", latency_stats([300.0])),
        LatencyCell("box", "pandas", None, "RuntimeError: boom"),
    )
    tp = (
        ThroughputCell("python", "noop", 2, 100, 2.0),
        ThroughputCell("box", "noop", 2, 300, 2.0),
    )
    mem = (
        MemoryRow("interpreters", 4, 4, 4 * 45 * 1024, "bare"),
        MemoryRow("pool", 0, 0, None, "not available: why"),
    )
    return Results(
        meta={"date": "today", "cpu": "test cpu"},
        variants=variants,
        workloads={"noop": "print(1)", "pandas": "import pandas"},
        latency=lat,
        throughput=tp,
        memory=mem,
    )


def test_latency_table_rows_and_ratios() -> None:
    t = latency_table(_results())
    rows = {r[0]: r for r in t.rows}
    assert set(rows) == {"python", "box"}, "unavailable variants get no row"
    assert rows["python"][1:3] == ("20.0 (28.0)", "1.00x")
    assert rows["box"][1:3] == ("40.0 (40.0)", "2.00x")
    assert rows["box"][3] == "failed"
    assert any("boom" in n for n in t.notes)


def test_report_text_and_markdown() -> None:
    r = _results()
    text = render_report(r, markdown=False)
    assert "not available: not installed" in text
    assert "150.0 (3.00x)" in text  # 300 runs / 2 s against python's 50/s
    assert "45.0" in text  # MiB per interpreter
    assert "date: today" in text
    md = render_report(r, markdown=True)
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table, "markdown has tables"
    widths = {line.count("|") for line in render(latency_table(r), markdown=True).splitlines()[2:]}
    assert len({w for w in widths if w}) == 1, "every markdown row has the same number of cells"


def test_targets_compare_sandcell_with_the_issue() -> None:
    r = Results(
        meta={},
        variants=(
            VariantInfo("python", "bare python", "none"),
            VariantInfo("sandcell-pool", "pool", "fresh"),
        ),
        workloads={"pandas": "import pandas", "noop": "print(1)"},
        latency=(LatencyCell("sandcell-pool", "pandas", latency_stats([2.0, 2.5, 9.0])),),
        throughput=(
            ThroughputCell("python", "noop", 2, 100, 1.0),
            ThroughputCell("sandcell-pool", "noop", 2, 150, 1.0),
        ),
        memory=(
            MemoryRow("separate interpreters", 4, 4, 4 * 40 * 1024),
            MemoryRow("sandcell pool", 4, 9, 4 * 10 * 1024),
        ),
    )
    rows = {row[0]: row[1:] for row in targets_table(r).rows}
    assert rows["sandcell-pool: pandas snippet median <= 3 ms"] == ("2.5 ms", "yes")
    assert latency_table(r).headers == ("variant", "pandas median (p90) ms", "pandas vs python")
    rate = next(v for k, v in rows.items() if "noop at c=2" in k)
    assert rate == ("1.50x (sandcell-pool, 150.0/s)", "no")
    mem = next(v for k, v in rows.items() if k.startswith("sandcell pool"))
    assert mem == ("10.0 MiB vs 40.0 MiB (0.25x)", "yes")


def test_cold_target_is_against_bare_bubblewrap() -> None:
    r = Results(
        meta={},
        variants=(
            VariantInfo("python", "bare python", "none"),
            VariantInfo("bwrap", "bare bubblewrap", "namespaces"),
            VariantInfo("sandcell-cold", "cold", "fresh"),
        ),
        workloads={"noop": "print(1)"},
        latency=(
            LatencyCell("bwrap", "noop", latency_stats([20.0, 20.0, 20.0])),
            LatencyCell("sandcell-cold", "noop", latency_stats([21.0, 22.0, 40.0])),
        ),
        throughput=(),
        memory=(),
    )
    rows = {row[0]: row[1:] for row in targets_table(r).rows}
    assert rows["sandcell-cold: noop median <= 1.10x bare bubblewrap's"] == (
        "1.10x (22.0 vs 20.0 ms)",
        "yes",
    )
    slower = replace(
        r, latency=(*r.latency[:1], LatencyCell("sandcell-cold", "noop", latency_stats([23.0])))
    )
    (row,) = targets_table(slower).rows
    assert row[1:] == ("1.15x (23.0 vs 20.0 ms)", "no")


def test_results_to_dict_is_json() -> None:
    d = json.loads(json.dumps(results_to_dict(_results())))
    box = next(c for c in d["latency"] if c["variant"] == "box" and c["workload"] == "noop")
    assert box["median_over_baseline"] == 2.0
    tp = next(c for c in d["throughput"] if c["variant"] == "box")
    assert tp["runs_per_s"] == 150.0
    assert tp["rate_over_baseline"] == 3.0
    assert d["memory"][0]["per_sandbox_mib"] == 45.0
    assert results_from_dict(d) == _results()


def test_proc_parsers() -> None:
    assert parse_cpu_model("processor\t: 0\nmodel name\t: Test CPU 9000\n") == "Test CPU 9000"
    assert parse_cpu_model("") == "unknown"
    assert parse_pss_kib("Rss:  100 kB\nPss:  42 kB\n") == 42
    with pytest.raises(ValueError, match="Pss"):
        parse_pss_kib("Rss: 1 kB\n")


def test_pss_and_descendants_of_a_real_child() -> None:
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("this kernel has no /proc/PID/smaps_rollup (Linux 4.14+)")
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1
    ) as child:
        try:
            assert child.pid in descendants(os.getpid())
            assert pss_kib(child.pid) > 0
        finally:
            child.kill()


def test_interleaved_latency_keeps_failures_apart() -> None:
    calls: list[str] = []

    def ok() -> None:
        calls.append("ok")

    def bad() -> None:
        raise RuntimeError("broken")

    out = interleaved_latency({"ok": ok, "bad": bad}, rounds=5, budget_s=60.0, rng=random.Random(0))
    samples = out["ok"]
    assert isinstance(samples, list)
    assert len(samples) == 5
    assert isinstance(out["bad"], RuntimeError)


def test_timed_pool_counts_and_raises() -> None:
    runs, secs = timed_pool(lambda: None, workers=2, seconds=0, min_runs=6)
    assert runs >= 6
    assert secs >= 0

    def bad() -> None:
        raise RuntimeError("broken")

    with pytest.raises(RuntimeError, match="broken"):
        timed_pool(bad, workers=2, seconds=0, min_runs=1)
