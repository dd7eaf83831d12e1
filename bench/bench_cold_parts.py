"""Where a cold no-op's CPU goes: the sandbox's against bare bubblewrap's, piece by piece.

Usage (root, cgroups)::

    .venv/bin/python bench/bench_cold_parts.py [--runs 30]

Each variant runs ``print(1)``, interleaved in a random order per round, and is charged the CPU of
every process it started, read from a cgroup (cgroup v1 ``cpuacct.usage``, v2 ``cpu.stat``): bare
``python -I -c`` and bare bubblewrap + python in a probe group of their own; sandcell's cold runs
through the run's own group (``usage.cpu_ms``: bwrap and the whole sandbox):

- ``sandcell-args``: sandcell's bwrap argument list (mounts, seccomp, namespaces) running
  ``python -I -c`` directly, without the boot;
- ``sandcell-pyinit``: the boot as the sandbox's pid 1, forking its Python supervisor (what
  every cold run did before the native init, and still does where it cannot be built:
  ``SANDCELL_NATIVE_INIT=0``);
- ``sandcell-cold``: the real cold run (the native init as pid 1 where a C compiler built it).

The wall time of each call is printed too (the bare variants' include the probe group's reads
and the move into it). Then the host process's own CPU per cold run, thread by thread
(``/proc/self/task``), which the CPU figures above do not include. Medians in milliseconds;
under load every figure grows, the differences between variants less than the wall times do.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_HOME = tempfile.mkdtemp(prefix="sandcell-cold-parts-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

from _common import baseline_env, bwrap_argv, python_argv  # noqa: E402

CODE = "print(1)"


class ProbeGroup:
    """A cgroup of its own for the bare variants' processes (v1 cpuacct or v2)."""

    def __init__(self) -> None:
        name = f"sandcell-cold-parts-{os.getpid()}"
        v1 = Path("/sys/fs/cgroup/cpuacct")
        if v1.is_dir():
            self.dir, self._v2 = v1 / name, False
        elif Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            self.dir, self._v2 = Path("/sys/fs/cgroup") / name, True
        else:
            sys.exit("no cgroup v1 cpuacct nor v2 hierarchy: nothing to charge the CPU to")
        self.dir.mkdir()

    def usage_ms(self) -> float:
        if self._v2:
            for line in (self.dir / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1000
            raise RuntimeError("no usage_usec in cpu.stat")
        return int((self.dir / "cpuacct.usage").read_text()) / 1e6

    def run(self, argv: list[str]) -> float:
        """CPU of ``argv`` and everything it started, in ms."""
        procs = str(self.dir / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        before = self.usage_ms()
        p = subprocess.run(
            argv, check=False, capture_output=True, env=baseline_env(), preexec_fn=enter
        )
        if p.returncode != 0 or p.stdout.strip() != b"1":
            raise RuntimeError(f"{argv[0]}: {p.returncode} {p.stderr[-300:]!r}")
        return self.usage_ms() - before

    def remove(self) -> None:
        self.dir.rmdir()


def _thread_cpu() -> dict[str, float]:
    """CPU so far of each thread of this process (ms), by thread id and name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        out[f"{name}[{tid}]"] = (int(fields[11]) + int(fields[12])) * 1000 / tick
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the bare variants are charged through a cgroup of their own")

    from sandcell import Executor, RunRequest
    from sandcell.backends.namespaces import NamespacesBackend
    from sandcell.runtimes import runtime_for

    executors = {
        k: Executor(home=Path(_HOME) / k, profile="unchecked")
        for k in ("sandcell-args", "sandcell-cold")
    }
    os.environ["SANDCELL_NATIVE_INIT"] = "0"  # read when the backend is made
    executors["sandcell-pyinit"] = Executor(home=Path(_HOME) / "pyinit", profile="unchecked")
    del os.environ["SANDCELL_NATIVE_INIT"]
    cold_backend = executors["sandcell-cold"].backend
    assert isinstance(cold_backend, NamespacesBackend)
    built = cold_backend.native_init
    print(f"native init: {built or 'not built (the boot forks its Python supervisor)'}")
    args_backend = executors["sandcell-args"].backend
    assert isinstance(args_backend, NamespacesBackend)
    python = runtime_for("python").sandbox_python
    # The sandbox's command without the boot: the same interpreter, bwrap's arguments as they are.
    args_backend._command_for = lambda language, runtime: [python, "-I", "-c", CODE]  # type: ignore[method-assign]

    probe = ProbeGroup()
    request = RunRequest(code=CODE)

    def sandcell(name: str) -> Callable[[], float]:
        def run() -> float:
            r = executors[name].run(request)
            if r.stdout.strip() != "1" or r.usage.cpu_ms is None:
                raise RuntimeError(f"{name}: {r.outcome} {r.stderr[-300:]}")
            return r.usage.cpu_ms

        return run

    variants: dict[str, Callable[[], float]] = {
        "python": lambda: probe.run(python_argv(CODE)),
        "bwrap": lambda: probe.run(bwrap_argv(CODE)),
        **{name: sandcell(name) for name in executors},
    }
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for run in variants.values():
            run()  # the first of each: spare groups, bytecode trees
        rng = random.Random(0)
        for _ in range(args.runs):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                time.sleep(0.02)
                t0 = time.perf_counter()
                cpu[name].append(variants[name]())
                wall[name].append((time.perf_counter() - t0) * 1000)
        # The host's own CPU per cold run, by thread (runs back to back, teardown drained).
        cold = executors["sandcell-cold"]
        cold_backend.wait_idle()
        before = _thread_cpu()
        for _ in range(args.runs):
            cold.run(request)
            time.sleep(0.02)
        cold_backend.wait_idle()
        after = _thread_cpu()
    finally:
        for ex in executors.values():
            ex.close()
        probe.remove()

    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"sandbox CPU per print(1), median of {args.runs} (ms; load average {load}):")
    med = {k: statistics.median(v) for k, v in cpu.items()}
    for name, value in med.items():
        print(f"  {name:16s} {value:7.2f}  ({value - med['bwrap']:+.2f} vs bwrap)")
    print(
        f"  the boot: {med['sandcell-cold'] - med['sandcell-args']:+.2f} under the native init, "
        f"{med['sandcell-pyinit'] - med['sandcell-args']:+.2f} with its Python supervisor; "
        f"sandcell's bwrap arguments over bare bwrap's {med['sandcell-args'] - med['bwrap']:+.2f}"
    )
    walls = {k: statistics.median(v) for k, v in wall.items()}
    print("wall time from call to result, median (ms; the probe group's bookkeeping included):")
    for name, value in walls.items():
        print(f"  {name:16s} {value:7.2f}  ({value / walls['bwrap']:.2f}x bwrap)")
    print(f"host process CPU per cold run, by thread (mean of {args.runs}, ms):")
    for key, value in sorted(after.items(), key=lambda kv: -(kv[1] - before.get(kv[0], 0.0))):
        spent = (value - before.get(key, 0.0)) / args.runs
        if spent > 0:
            print(f"  {key:32s} {spent:6.2f}")


if __name__ == "__main__":
    main()
