"""Benchmark: where the idle memory of a namespaces warm pool goes, per process and per mapping.

Usage::

    .venv/bin/python bench/bench_density.py [--pool-sizes 4,16] [--preload numpy,pandas]
        [--rounds 3] [--base SRC_DIR] [--json FILE]

For each pool size an Executor with a warm pool (``start_mode`` pool, the modules preloaded)
fills its pool and goes quiet; then every process below this one is read from
``/proc/PID/smaps`` and ``/proc/PID/status``: its role (bubblewrap, the template, the forked
child outside the run's pid namespace, the run's pid 1, the program's process waiting for its
request), its PSS, its private pages by mapping (the heap, anonymous mappings, the stacks, the
interpreter binary's data, shared libraries' data, other files) and its page tables
(``VmPTE``, which PSS does not count). The figures:

- PSS per ready sandbox as ``bench/compare.py`` reports it: every process (template and
  bubblewrap included) over the pool size;
- the marginal cost of one more ready sandbox: the slope of total PSS (and of page tables)
  between the smallest and the largest pool size, which is what thousands of ready sandboxes
  per host each cost once the template's image is paid.

``--base SRC_DIR`` measures another tree of sandcell too (a ``git worktree`` of the commit
before a change, its ``src``), alternating with this one round by round, each in a fresh
subprocess, so drift on a noisy host hits both alike; ratios are against that base.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import descendants

MIB = 1024.0
"""KiB per MiB: every figure below is read in KiB."""
ROLES = ("bwrap", "template", "outer child", "pid 1", "program", "other")


@dataclass
class Proc:
    pid: int
    role: str
    pss_kib: int
    page_tables_kib: int
    private_kib: dict[str, int] = field(default_factory=dict)
    """Private (clean + dirty) KiB by mapping kind."""


def _mapping_kind(name: str) -> str:
    if name in ("[heap]", "[stack]"):
        return name
    if not name:
        return "anon"
    if name.startswith("["):
        return "other"
    base = os.path.basename(name)
    if base.startswith("python"):
        return "python binary"
    if ".so" in base:
        return "libraries"
    return "other"


def read_proc(pid: int) -> tuple[Counter[str], int, int, list[str]]:
    """(private KiB by mapping kind, PSS KiB, page tables KiB, NSpid) of one process."""
    private: Counter[str] = Counter()
    pss = 0
    kind = "anon"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if not head.endswith(":"):  # a mapping's first line: range perms offset dev inode name
                parts = line.split(None, 5)
                kind = _mapping_kind(parts[5].strip() if len(parts) > 5 else "")
            elif head in ("Private_Clean:", "Private_Dirty:"):
                private[kind] += int(line.split()[1])
            elif head == "Pss:":
                pss += int(line.split()[1])
    pte, nspid = 0, []
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmPTE":
                pte = int(value.split()[0])
            elif key == "NSpid":
                nspid = value.split()
    return private, pss, pte, nspid


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _is_bwrap(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return os.path.basename(f.read().split(b"\0", 1)[0]) == b"bwrap"


def classify(pids: list[int]) -> list[Proc]:
    """Each process with its role, told apart by its pid namespaces and its parent."""
    out: list[Proc] = []
    info: dict[int, tuple[Counter[str], int, int, list[str]]] = {}
    for pid in pids:
        try:
            info[pid] = read_proc(pid)
        except (OSError, ValueError, IndexError):
            continue
    roles: dict[int, str] = {}
    for pid in info:
        try:
            bwrap = _is_bwrap(pid)
        except OSError:
            continue
        roles[pid] = "bwrap" if bwrap else ""
    for pid, (private, pss, pte, nspid) in info.items():
        role = roles.get(pid, "other")
        if not role:
            try:
                parent = _parent(pid)
            except OSError:
                parent = 0
            if len(nspid) >= 3 and nspid[-1] == "1":
                role = "pid 1"
            elif len(nspid) >= 3:
                role = "program"
            elif roles.get(parent) == "bwrap" and len(nspid) == 2:
                role = "template"
            elif len(nspid) == 2:
                role = "outer child"
            else:
                role = "other"
        out.append(Proc(pid, role, pss, pte, dict(private)))
    return out


def measure(pool_size: int, preload: tuple[str, ...]) -> dict[str, Any]:
    """One pool of ``pool_size``, full and quiet: every process of it, classified."""
    # Imported here: they import sandcell, which --base puts first on the path of a round.
    from _memory import _wait_pool_full, settle
    from _variants import open_warm_executor

    home = Path(tempfile.mkdtemp(prefix="sandcell-density-"))
    before = set(descendants(os.getpid()))
    ex, why = open_warm_executor("pool", home=home, pool_size=pool_size, preload=preload)
    if ex is None:
        raise SystemExit(f"no warm pool: {why}")
    try:
        if not _wait_pool_full(ex, pool_size):
            raise SystemExit(f"the pool did not fill to {pool_size} in 60 s")
        procs = classify(settle(before))
    finally:
        ex.close()
        shutil.rmtree(home, ignore_errors=True)
    return {"pool_size": pool_size, "procs": [asdict(p) for p in procs]}


def summarise(sample: dict[str, Any]) -> dict[str, Any]:
    """Totals, and per role: processes, PSS, private KiB by mapping kind, page tables."""
    n = sample["pool_size"]
    by_role: dict[str, dict[str, Any]] = {}
    for p in sample["procs"]:
        r = by_role.setdefault(p["role"], {"count": 0, "pss": 0, "pte": 0, "private": Counter()})
        r["count"] += 1
        r["pss"] += p["pss_kib"]
        r["pte"] += p["page_tables_kib"]
        r["private"].update(p["private_kib"])
    pss = sum(p["pss_kib"] for p in sample["procs"])
    pte = sum(p["page_tables_kib"] for p in sample["procs"])
    return {
        "pool_size": n,
        "processes": len(sample["procs"]),
        "pss_kib": pss,
        "pte_kib": pte,
        "pss_per_ready_mib": pss / MIB / n,
        "by_role": {k: {**v, "private": dict(v["private"])} for k, v in by_role.items()},
    }


def _one_round(sizes: list[int], preload: tuple[str, ...]) -> list[dict[str, Any]]:
    return [summarise(measure(n, preload)) for n in sizes]


def _run_tree(src: str | None, sizes: list[int], preload: tuple[str, ...]) -> list[dict[str, Any]]:
    """One round in a fresh interpreter, with ``src`` first on the path (None: this tree)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    argv = [sys.executable, __file__, "--one-round", ",".join(map(str, sizes))]
    argv += ["--preload", ",".join(preload)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"a round failed ({src or 'this tree'}):\n{out.stderr[-3000:]}")
    rounds: list[dict[str, Any]] = json.loads(out.stdout)
    return rounds


def marginal(summaries: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(PSS, page tables) in MiB that one more ready sandbox adds: the slope between the
    smallest and the largest pool size of one round."""
    if len(summaries) < 2:
        return None
    lo = min(summaries, key=lambda s: s["pool_size"])
    hi = max(summaries, key=lambda s: s["pool_size"])
    dn = hi["pool_size"] - lo["pool_size"]
    if not dn:
        return None
    return (
        (hi["pss_kib"] - lo["pss_kib"]) / MIB / dn,
        (hi["pte_kib"] - lo["pte_kib"]) / MIB / dn,
    )


def _per_ready(rounds: list[list[dict[str, Any]]], pool_size: int) -> list[float]:
    """PSS per ready sandbox (MiB) of every round at one pool size."""
    return [r["pss_per_ready_mib"] for rnd in rounds for r in rnd if r["pool_size"] == pool_size]


def _print_breakdown(summary: dict[str, Any]) -> None:
    n = summary["pool_size"]
    kinds = ("[heap]", "anon", "[stack]", "python binary", "libraries", "other")
    print(f"\npool size {n}: {summary['processes']} processes, PSS {summary['pss_kib'] / MIB:.1f}")
    print(f"MiB ({summary['pss_per_ready_mib']:.2f} MiB per ready sandbox), page tables")
    print(f"{summary['pte_kib'] / MIB:.1f} MiB. Per process of each role, KiB:\n")
    print("| role | processes | PSS | private: " + " | ".join(kinds) + " | page tables |")
    print("|:---|---:|---:|" + "---:|" * (len(kinds) + 1))
    for role in ROLES:
        r = summary["by_role"].get(role)
        if not r:
            continue
        c = r["count"]
        cells = " | ".join(f"{r['private'].get(k, 0) / c:.0f}" for k in kinds)
        print(f"| {role} | {c} | {r['pss'] / c:.0f} | {cells} | {r['pte'] / c:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--pool-sizes", default="4,16", help="comma-separated pool sizes")
    ap.add_argument("--preload", default="numpy,pandas")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--base", help="another tree's src directory, measured alternately")
    ap.add_argument("--json", type=Path, metavar="FILE")
    ap.add_argument("--one-round", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    preload = tuple(m for m in args.preload.split(",") if m)
    if args.one_round:
        sizes = [int(s) for s in args.one_round.split(",")]
        print(json.dumps(_one_round(sizes, preload)))
        return 0
    sizes = [int(s) for s in args.pool_sizes.split(",")]
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.base:
        trees.insert(0, ("base", args.base))
    results: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _ in trees}
    load: list[float] = []
    for i in range(args.rounds):
        order = trees if i % 2 == 0 else trees[::-1]
        for name, src in order:
            load.append(os.getloadavg()[0])
            t0 = time.monotonic()
            results[name].append(_run_tree(src, sizes, preload))
            print(f"round {i + 1} {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    for name, _ in trees:
        print(f"\n## {name}")
        _print_breakdown(results[name][-1][-1])
        for n in sizes:
            per = _per_ready(results[name], n)
            print(f"\nPSS per ready sandbox, pool {n}: median {statistics.median(per):.2f} MiB")
            print(f"(rounds: {', '.join(f'{x:.2f}' for x in per)})")
        slopes = [m for m in (marginal(rnd) for rnd in results[name]) if m]
        if slopes:
            pss = statistics.median(s[0] for s in slopes)
            pte = statistics.median(s[1] for s in slopes)
            print(f"\nmarginal per ready sandbox: PSS {pss:.2f} MiB + page tables {pte:.2f} MiB")
            print(f"(rounds: {', '.join(f'{s[0]:.2f}+{s[1]:.2f}' for s in slopes)})")
    if args.base:
        print("\n## this tree / base (medians)")
        for n in sizes:
            med = {name: statistics.median(_per_ready(results[name], n)) for name, _ in trees}
            print(f"pool {n}: {med['this tree'] / med['base']:.2f}x")
    print(f"\nload average (1 min) at each round's start: {', '.join(f'{x:.2f}' for x in load)}")
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "results": results, "load": load}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
