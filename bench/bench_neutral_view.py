"""What serving a sandbox's host sources from overlays costs a cold run (``neutral_sources.py``).

    .venv/bin/python bench/bench_neutral_view.py [--rounds N]

A cold sandcell run (profile ``unchecked``) is timed with the sources as it ships them (each
read-only host source an overlay, the runtime's bytecode rewritten above it: mountinfo and the
bytecode name no host path) and with the plain binds it had before (the same run with the plan
replaced by an empty one), for a no-op program, ``import numpy`` (thousands of lookups through
the overlay) and a no-op with one input file; bare bubblewrap + python is the baseline. Variants
are interleaved in shuffled order each round, so load on the shared host hits all alike; the
medians are printed with the overlay variant's ratio to the plain one measured in the same run.
Run as root (the supervisor mounts the overlays on the host; an ordinary user's helper does it
in its own namespace, at the same cost per mount).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

_HOME = tempfile.mkdtemp(prefix="sandcell-bench-neutral-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _common import Runner, bwrap_argv, interleaved_latency, subprocess_runner  # noqa: E402

from sandcell import Executor, RunRequest  # noqa: E402
from sandcell.backends.host import neutral_sources  # noqa: E402
from sandcell.spec import input_from_path  # noqa: E402

_shipped = neutral_sources.plan


def _plain(*_args: object, **_kw: object) -> neutral_sources.NeutralSources:
    return neutral_sources.NeutralSources()


def _runner(ex: Executor, code: str, *, neutral: bool, inputs: tuple[Path, ...] = ()) -> Runner:
    request = RunRequest(code=code, inputs=tuple(input_from_path(p) for p in inputs))

    def run() -> None:
        neutral_sources.plan = _shipped if neutral else _plain  # type: ignore[assignment]
        res = ex.run(request)
        if res.outcome.value != "ok" or "done" not in res.stdout:
            raise RuntimeError(f"{res.outcome.value}: {res.stderr[-500:]}")
        mounts = "overlay sandcell" in res.stdout
        if mounts != neutral:
            raise RuntimeError(f"the run's mounts are not the {neutral=} variant's")

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root: the cold path mounts the overlays on the host", file=sys.stderr)
        return 2
    data = Path(_HOME) / "input.csv"
    data.write_text("a,b\n1,2\n")
    show = "print(open('/proc/self/mountinfo').read()); print('done')"
    ex = Executor(profile="unchecked")
    try:
        # The first run builds the bytecode tree once (not timed).
        _runner(ex, show, neutral=True)()
        runners: dict[str, Runner] = {"bwrap noop": subprocess_runner(bwrap_argv("pass"))}
        for neutral in (True, False):
            tag = "overlay" if neutral else "plain"
            runners[f"{tag} noop"] = _runner(ex, show, neutral=neutral)
            runners[f"{tag} numpy"] = _runner(ex, "import numpy\n" + show, neutral=neutral)
            runners[f"{tag} input"] = _runner(ex, show, neutral=neutral, inputs=(data,))
        samples = interleaved_latency(
            runners, rounds=args.rounds, budget_s=120, rng=random.Random(1)
        )
    finally:
        neutral_sources.plan = _shipped  # type: ignore[assignment]
        ex.close()
        shutil.rmtree(_HOME, ignore_errors=True)
    medians: dict[str, float] = {}
    for name, got in samples.items():
        if isinstance(got, BaseException):
            print(f"{name:16} FAILED: {got}")
            return 1
        medians[name] = statistics.median(got)
        print(f"{name:16} median {medians[name]:7.1f} ms  ({len(got)} runs)")
    for what in ("noop", "numpy", "input"):
        ratio = medians[f"overlay {what}"] / medians[f"plain {what}"]
        print(f"{what:6} overlay / plain = {ratio:.3f}")
    print(f"noop   overlay / bare bwrap = {medians['overlay noop'] / medians['bwrap noop']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
