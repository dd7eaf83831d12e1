"""Sessions that last: a paused session's resume against starting it cold, fork against resume,
and what a paused session and a set of forks hold, per rung.

    .venv/bin/python bench/bench_pause.py [--rungs namespaces,gvisor,microvm] [--rounds N]

Per rung, in one process, round by round so that load from other work hits both alike:

* ``cold``: open a session under the ``analysis`` profile (its runtime has pandas) on a new
  sandbox (no pool), and run ``import pandas`` until the cell answers: what an agent that lost
  its session pays to get back to where it was;
* ``resume``: pause that session (``memory`` where the rung offers it, else ``files``), then
  :meth:`Executor.resume` and a first cell using pandas, until it answers;
* ``fork 4``: :meth:`Session.fork` of a live session into 4, until all four are up (each is a
  restore of the same state).

Prints medians in ms, the stored size of a paused state, the processes left while paused, and
on the microVM the PSS of the 4 forks' QEMU processes against one session's (unchanged guest
pages shared through the page cache of the state's RAM file). The issue's targets: resume at
least 3x faster than cold on gVisor and microVM; fork into 4 under 2x one resume; the 4 forks'
PSS under 2x one session's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import descendants, pss_kib

from sandcell import Executor, Outcome
from sandcell.sessions import PauseMode, Session

IMPORT = "import pandas as pd\nprint(len(pd.DataFrame({'a': [1, 2, 3]})))"
USE = "print(pd.DataFrame({'a': [1, 2, 3]}).a.sum())"
USE_FILES = "import pandas as pd\n" + USE


def _ok(s: Session, code: str) -> None:
    r = s.run(code)
    if r.outcome is not Outcome.OK:
        raise RuntimeError(f"cell failed on {s.info().backend}: {r.reason} {r.stderr[-400:]}")


def _pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += pss_kib(pid)
        except (OSError, ValueError):
            continue
    return total / 1024


def _tree(pid: int | None) -> list[int]:
    if pid is None:
        return []
    return [pid, *descendants(pid)]


def bench_rung(rung: str, rounds: int) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(prefix=f"bench-pause-{rung}-"))
    ex = Executor(backend=rung, home=home, profile="analysis")
    cold: list[float] = []
    resumed: list[float] = []
    forked: list[float] = []
    stored: list[int] = []
    leftovers: list[int] = []
    mode = PauseMode.FILES
    pss_one = pss_forks = None
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            s = ex.session()
            _ok(s, IMPORT)
            cold.append((time.perf_counter() - t0) * 1000)
            mode = PauseMode.MEMORY if PauseMode.MEMORY in s.pause_modes else PauseMode.FILES
            if pss_one is None:
                pss_one = _pss_mib(_tree(s.sandbox_pid))
            sandbox = _tree(s.sandbox_pid)
            state = s.pause(mode=mode)
            stored.append(state.stored_bytes)
            leftovers.append(len([p for p in sandbox if _alive(p)]))
            t0 = time.perf_counter()
            back = ex.resume(s.id)
            _ok(back, USE if mode is PauseMode.MEMORY else USE_FILES)
            resumed.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            forks = back.fork(4, mode=mode)
            forked.append((time.perf_counter() - t0) * 1000)
            if pss_forks is None:
                for f in forks:
                    _ok(f, USE if mode is PauseMode.MEMORY else USE_FILES)
                pss_forks = _pss_mib([p for f in forks for p in _tree(f.sandbox_pid)])
            for f in forks:
                f.close()
            back.close()
    finally:
        ex.close()
    return {
        "rung": rung,
        "mode": mode.value,
        "cold_ms": statistics.median(cold),
        "resume_ms": statistics.median(resumed),
        "fork4_ms": statistics.median(forked),
        "stored_mib": statistics.median(stored) / 2**20,
        "processes_left_paused": max(leftovers),
        "pss_one_mib": pss_one,
        "pss_fork4_mib": pss_forks,
    }


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", default="namespaces,gvisor,microvm")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for rung in args.rungs.split(","):
        try:
            rows.append(bench_rung(rung, args.rounds))
        except Exception as exc:  # a rung this host lacks: say so, measure the others
            print(f"{rung}: not measured ({type(exc).__name__}: {exc})")
    print(
        f"{'rung':<11} {'mode':<7} {'cold':>9} {'resume':>9} {'cold/resume':>12} "
        f"{'fork 4':>9} {'fork4/resume':>13} {'stored':>9} {'left':>5} "
        f"{'PSS 1':>8} {'PSS 4 forks':>12} {'ratio':>6}"
    )
    for r in rows:
        one, four = r["pss_one_mib"], r["pss_fork4_mib"]
        pss_ratio = f"{four / one:.2f}x" if one and four else "-"
        print(
            f"{r['rung']:<11} {r['mode']:<7} {r['cold_ms']:>7.0f}ms {r['resume_ms']:>7.0f}ms "
            f"{r['cold_ms'] / r['resume_ms']:>11.2f}x {r['fork4_ms']:>7.0f}ms "
            f"{r['fork4_ms'] / r['resume_ms']:>12.2f}x {r['stored_mib']:>6.1f}MiB "
            f"{r['processes_left_paused']:>5} {one or 0:>6.0f}Mi {four or 0:>10.0f}Mi "
            f"{pss_ratio:>6}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
