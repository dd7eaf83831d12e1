"""Where one pooled run's time goes, step by step: CLOCK_MONOTONIC stamps on the host and inside.

Usage::

    .venv/bin/python bench/timeline_pool.py [--runs 40] [--workloads noop,pandas] [--pool-size 4]
        [--settle]

    # before/after a change: the other tree's sources first on the path
    PYTHONPATH=/tmp/base/src .venv/bin/python bench/timeline_pool.py --runs 20 --settle

The host's stamps come from wrappers around the executor, the warm starter and the driver of the
run (``warm_drive``); the sandbox's from an instrumented copy of the zygote (this process only:
``compile_zygote`` is replaced here, the committed zygote has no stamps). pid 1 (G) and the
program's process (P) write theirs to the run's stderr (``T <name> <ns>``) once their stdio is
the run's; the kernel's CLOCK_MONOTONIC is the same inside the sandbox's namespaces (no time
namespace), so the stamps are on one clock. Prints the median and the quartiles of each step over
the measured runs (the first run of each workload is left out), and the load average.

The arm of each pooled sandbox (pid 1 forks the program's process, which restricts itself) is
stamped too, long before its request: those stamps are written out with the request's. Below the
steps, the sandbox's CPU (its cgroup's, as the result reports it) while armed and in the run,
and this process's CPU per run: on a loaded host these vary far less than the wall times.

Each stamp inside costs some 20-40 microseconds (a read of ``/proc/self/stat`` for the faults),
which the sandbox's steps and CPU include.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

_HOME = tempfile.mkdtemp(prefix="sandcell-timeline-")
os.environ["SANDCELL_HOME"] = _HOME
os.environ["SANDCELL_RUNS"] = os.path.join(_HOME, "runs")

WORKLOADS: dict[str, str] = {
    "noop": "print(1)",
    "pandas": "import pandas as pd; print(pd.DataFrame({'a':[1,2,3]}).sum().to_dict())",
}

# The stamps' helpers, added to the zygote's base part (the parts share one namespace).
_HELPERS = """

_STAMPS = []


def _stamp(name):
    import time
    now = time.monotonic_ns()
    # The process's minor faults so far (field 10 of /proc/self/stat; the name may hold spaces).
    fd = os.open("/proc/self/stat", os.O_RDONLY)
    try:
        stat = os.read(fd, 1024)
    finally:
        os.close(fd)
    minflt = int(stat.rsplit(b")", 1)[1].split()[7])
    _STAMPS.append("T %s %d %d\\n" % (name, now, minflt))


def _flush_stamps():
    try:
        os.write(2, "".join(_STAMPS).encode())
    except OSError:
        pass
    _STAMPS.clear()
"""

# (part, the function the anchor is in, a line's text, "after" or "before", the stamp, flush)
_ANCHORS: tuple[tuple[str, str, str, str, str, bool], ...] = (
    # The arm, long before the request: written out with the request's stamps.
    ("init", "def _armed(", "watched = {", "before", "a_arm", False),
    ("init", "def _armed(", "program = os.fork()", "after", "a_forked", False),
    ("init", "def _armed(", "ready = g_end.recv(1)", "after", "a_ready", False),
    ("program", "def _prepared_program(", "_drop_capabilities()", "after", "a_caps", False),
    ("program", "def _prepared_program(", "_lock_down(", "after", "a_locked", False),
    ("program", "def _prepared_program(", "_reseed()", "after", "a_reseeded", False),
    ("init", "def _armed(", "body, fds = _recv(sock, 64)", "after", "g_req", False),
    ("init", "def _armed(", "req = json.loads(body)", "after", "g_json", False),
    ("init", "def _armed(", "os.close(fd)", "after", "g_stdio", False),
    ("init", "def _armed(", "_apply_request(req, fds[4:])", "after", "g_applied", False),
    ("init", "def _armed(", '_limit(program, req["rlimits"])', "after", "g_limited", False),
    ("init", "def _armed(", "_install_seccomp(seccomp_program)", "after", "g_dropped", False),
    ("init", "def _armed(", "g_end.close()", "after", "g_sent", True),
    ("program", "def _prepared_program(", "body, fds = _recv(sock, 4)", "after", "p_req", False),
    ("program", "def _prepared_program(", "sock.close()", "after", "p_stdio", False),
    ("program", "def _prepared_program(", "= json.loads(body)", "after", "p_json", False),
    ("program", "def _prepared_program(", "_set_env(|os.environ.update(", "after", "p_env", False),
    ("program", "def _prepared_program(", "return req", "before", "p_ready", True),
    ("program", "def _run_program(", 'boot["_run_python"](', "before", "p_run", False),
    ("program", "def _run_program(", "except SystemExit as exc:", "before", "p_ran", False),
    ("program", "def _end_quietly(", "if quiesce is None:", "before", "p_end", True),
)

# (from, to, what it is), in the order of a run
STEPS: tuple[tuple[str, str, str], ...] = (
    ("a_arm", "a_forked", "arm: pid 1 forks the program's process (in pid 1)"),
    ("a_forked", "a_caps", "arm: program's process: descriptors, cwd, capabilities"),
    ("a_caps", "a_locked", "arm: program's process: Landlock and seccomp"),
    ("a_locked", "a_reseeded", "arm: program's process: random generators reseeded"),
    ("a_forked", "a_ready", "arm: pid 1 hears the program's process is ready"),
    ("x_call", "h_run", "executor before the backend (admission)"),
    ("h_run", "h_send", "host: take the child, limits, request document"),
    ("h_send", "g_req", "request sent -> pid 1 has it"),
    ("g_req", "g_json", "pid 1: the request parsed"),
    ("g_json", "g_stdio", "pid 1: stdio"),
    ("g_stdio", "g_applied", "pid 1: tmpfs sizes, script, read-only remounts"),
    ("g_applied", "g_limited", "pid 1: the program's rlimits (prlimit)"),
    ("g_limited", "g_dropped", "pid 1: its capability drop and seccomp"),
    ("g_dropped", "g_sent", "pid 1: the program's document sent"),
    ("g_sent", "p_req", "-> the program's process has it"),
    ("p_req", "p_stdio", "program's process: stdio"),
    ("p_stdio", "p_json", "program's process: its document parsed"),
    ("p_json", "p_env", "program's process: environment"),
    ("p_env", "p_ready", "program's process: 'started'"),
    ("p_ready", "p_run", "-> the program starts (argv, paths)"),
    ("p_run", "p_ran", "the program itself (compile, run)"),
    ("p_ran", "p_end", "the program's epilogue (threads, atexit, gc, flush)"),
    ("p_end", "h_done", "stop, pid 1's D report, host wakes"),
    ("h_done", "h_frozen", "host: freeze the cgroup"),
    ("h_frozen", "h_result", "host: drain, usage, exports, result"),
    ("h_result", "x_return", "executor after the backend (record, audit)"),
    ("h_send", "p_run", "= request sent to program start"),
    ("p_ran", "h_frozen", "= program end to frozen"),
    ("x_call", "x_return", "= Executor.run"),
)


def _instrument(part: str, source: str) -> str:
    lines = source.splitlines()
    if part == "base":
        return source + _HELPERS
    for a_part, func, text, where, name, flush in _ANCHORS:
        if a_part != part:
            continue
        start = next((i for i, line in enumerate(lines) if line.startswith(func)), None)
        if start is None:
            sys.exit(f"timeline: no {func} in the zygote's {part} part")
        # Alternatives (``a|b``): the same point in the zygote before and after a change.
        at = next(
            (i for i in range(start, len(lines)) if any(t in lines[i] for t in text.split("|"))),
            None,
        )
        if at is None:
            sys.exit(f"timeline: no {text!r} in {func} of the zygote's {part} part")
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        if where == "before" and text.startswith("except"):
            # The end of the try body: the stamp goes at the body's indentation.
            indent += "    "
        added = [f'{indent}_stamp("{name}")'] + ([f"{indent}_flush_stamps()"] if flush else [])
        if where == "after" and lines[at].rstrip().endswith("("):
            sys.exit(f"timeline: {text!r} spans lines")
        pos = at + 1 if where == "after" else at
        lines[pos:pos] = added
    return "\n".join(lines) + "\n"


def _install(stamps: list[tuple[str, int]]) -> None:
    """The host's wrappers and the instrumented zygote (before the executor starts)."""
    import marshal

    from sandcell import Executor
    from sandcell.backends.namespaces import template, warm, warm_drive

    def compile_zygote() -> dict[str, bytes]:
        import importlib.util

        header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") * 3
        files = {}
        for part in ("", *template.ZYGOTE_PARTS):
            script = template.ZYGOTE_SCRIPT
            src_path = script.with_name(f"_zygote_{part}.py") if part else script
            source = _instrument(part, src_path.read_text()) if part else src_path.read_text()
            name = f"zygote_{part}" if part else "zygote"
            code = compile(source, f"/sandcell/{name}.py", "exec", dont_inherit=True)
            files[f"{name}.pyc"] = header + marshal.dumps(code)
        return files

    warm.compile_zygote = compile_zygote  # type: ignore[attr-defined]

    def mark(name: str) -> None:
        stamps.append((name, time.monotonic_ns()))

    def wrap(owner: Any, attr: str, before: str, after: str) -> None:
        inner: Callable[..., Any] = getattr(owner, attr)

        def wrapped(*a: Any, **k: Any) -> Any:
            mark(before)
            try:
                return inner(*a, **k)
            finally:
                mark(after)

        setattr(owner, attr, wrapped)

    wrap(Executor, "run", "x_call", "x_return")
    wrap(warm.WarmStarter, "run", "h_run", "h_result")
    take = warm.WarmStarter.run

    def run_noting(self: Any, *a: Any, **k: Any) -> Any:
        _STARTERS[:] = [self]
        return take(self, *a, **k)

    warm.WarmStarter.run = run_noting  # type: ignore[method-assign]
    arm = warm.WarmStarter._arm

    def arm_noting(self: Any, child: Any) -> Any:
        armed = arm(self, child)
        if armed.armed is not None:
            _ARM_CPU.append(armed.armed.cpu_base_ms)
        return armed

    warm.WarmStarter._arm = arm_noting  # type: ignore[method-assign]
    # The names warm_drive imported, replaced where drive() looks them up.
    send: Callable[..., Any] = getattr(warm_drive, "send_message")  # noqa: B009

    def send_message(*a: Any, **k: Any) -> Any:
        mark("h_send")
        return send(*a, **k)

    setattr(warm_drive, "send_message", send_message)  # noqa: B010
    pump: Callable[..., Any] = getattr(warm_drive, "pump")  # noqa: B009

    def pump_wrapped(*a: Any, **k: Any) -> Any:
        other, after = k["other"], k.get("after")
        seen = bytearray()

        def note(fd: int, kind: str, chunk: bytes) -> None:
            seen.extend(chunk)
            if b"1" in chunk and seen.startswith(b"1") and len(seen) == len(chunk):
                mark("h_started")
            if b"D" in chunk:
                mark("h_done")
            other(fd, kind, chunk)

        k["other"] = note
        if after is not None:

            def after_wrapped() -> bool:
                frozen = bool(after())
                if frozen:
                    mark("h_frozen")
                return frozen

            k["after"] = after_wrapped
        return pump(*a, **k)

    setattr(warm_drive, "pump", pump_wrapped)  # noqa: B010


_STARTERS: list[Any] = []
# The sandbox's CPU (its cgroup) from its move into the cgroup to armed: pid 1's wait for the
# arm and the program's process's restrictions, per pooled sandbox.
_ARM_CPU: list[float] = []


def _settle(size: int) -> None:
    """Wait (bounded) until the pool holds ``size`` prepared sandboxes."""
    end = time.monotonic() + 30
    while _STARTERS and time.monotonic() < end:
        pool = _STARTERS[0]._pool
        if pool is None or len(pool._ready) >= size:
            return
        time.sleep(0.005)


def _parse(stamps: list[tuple[str, int]], stderr: str) -> tuple[dict[str, int], dict[str, int]]:
    """The stamps' times, and the minor faults of the sandbox's processes at theirs."""
    out = dict(stamps)
    faults: dict[str, int] = {}
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "T" and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
            faults[parts[1]] = int(parts[3])
    return out, faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--workloads", default="noop,pandas")
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument(
        "--settle",
        action="store_true",
        help="before each run, wait until the pool is full again (the hand-off alone, not the "
        "refill's pace)",
    )
    args = ap.parse_args()

    stamps: list[tuple[str, int]] = []
    _install(stamps)
    from _variants import PRELOAD, open_warm_executor

    from sandcell import RunRequest

    ex, why = open_warm_executor(
        "pool", home=Path(_HOME), pool_size=args.pool_size, preload=PRELOAD
    )
    if ex is None:
        sys.exit(f"no pooled executor: {why}")
    import sandcell

    print(f"sandcell from {Path(sandcell.__file__).parent}; load {os.getloadavg()}")
    with ex:
        for workload in args.workloads.split(","):
            code = WORKLOADS[workload]
            rows: list[dict[str, int]] = []
            fault_rows: list[dict[str, int]] = []
            sandbox_cpu: list[float] = []
            host_cpu: list[float] = []
            for i in range(args.runs + 1):
                if args.settle:
                    _settle(args.pool_size)
                stamps.clear()
                cpu0 = time.process_time()
                r = ex.run(RunRequest(code=code))
                cpu1 = time.process_time()
                if not r.ok or r.start.mode != "pool":
                    sys.exit(f"{workload}: run {r.outcome} ({r.start.mode}): {r.stderr[-300:]}")
                if i:
                    times, faults = _parse(stamps, r.stderr)
                    rows.append(times)
                    fault_rows.append(faults)
                    host_cpu.append((cpu1 - cpu0) * 1000)
                    if r.usage.cpu_ms is not None:
                        sandbox_cpu.append(r.usage.cpu_ms)
            print(f"\n{workload}: {args.runs} pooled runs (ms: median [q1 q3])")
            for a, b, what in STEPS:
                d = [(row[b] - row[a]) / 1e6 for row in rows if a in row and b in row]
                if len(d) < 2:
                    print(f"  {a:>9} -> {b:<9} {'-':>7}  {what} (no stamps)")
                    continue
                q = statistics.quantiles(d, n=4)
                f = [row[b] - row[a] for row in fault_rows if a in row and b in row]
                same = a[0] == b[0] and a[0] in "gp" and f
                print(
                    f"  {a:>9} -> {b:<9} {statistics.median(d):7.2f} "
                    f"[{q[0]:6.2f} {q[2]:6.2f}]"
                    + (f" {statistics.median(f):5.0f} faults" if same else " " * 12)
                    + f"  {what}"
                )
            # CPU times: far steadier than wall times on a loaded host.
            arm_cpu, _ARM_CPU[:] = list(_ARM_CPU), []
            for what, values in (
                ("the sandbox's CPU while armed (its cgroup, before the request)", arm_cpu),
                ("the sandbox's CPU in the run (its cgroup, from the request on)", sandbox_cpu),
                ("this process's CPU per run (all threads)", host_cpu),
            ):
                if len(values) >= 2:
                    q = statistics.quantiles(values, n=4)
                    print(
                        f"  {statistics.median(values):7.2f} [{q[0]:6.2f} {q[2]:6.2f}] ms  {what}"
                    )
    print(f"\nload {os.getloadavg()}")


if __name__ == "__main__":
    main()
