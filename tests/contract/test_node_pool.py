"""The namespaces rung's pool of waiting Node sandboxes (``backends/namespaces/node_pool.py``),
with real sandboxes: a pooled JavaScript or TypeScript run is the program ``node main.js`` would
run (module format, types, exit statuses, uncaught errors, exports) in a sandbox started ahead;
what the pool cannot serve starts cold and says why; a closed pool leaves nothing behind.

The session-wide pool executor (tests/conftest.py) serves the first two tests: its Node pool is
filled from the first JavaScript run on, so a test's first run of a shape may start cold.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from tests.conftest import runtime_required, settle_pools

from sandcell import Executor, IsolationMode, Limits, RunRequest, RunResult
from sandcell.backends.warm import WarmConfig

PROGRAMS = {
    # name: (language, code)
    "esm": (
        "javascript",
        "import fs from 'node:fs'\nfs.writeFileSync('out.txt', 'hi')\n"
        "console.log(import.meta.url, process.argv.length, typeof require)\nawait 0\n",
    ),
    "cjs": (
        "javascript",
        "console.log(__filename, require.main === module, process.argv.slice(1))\n"
        "console.error(require('node:fs').readFileSync(0).length)\n",
    ),
    "ts": ("typescript", "const n: number = 2\nconsole.log(n * 21, __filename)\n"),
    "exit_code": ("javascript", "console.log('x')\nprocess.exitCode = 3\n"),
    "exit": ("javascript", "setTimeout(() => console.log('never'), 1000)\nprocess.exit(4)\n"),
    "throw": ("javascript", "function f() {\n  throw new Error('boom')\n}\nf()\n"),
    "rejection": ("javascript", "Promise.reject(new TypeError('nope'))\n"),
    "output_cap": ("javascript", "process.stdout.write('x'.repeat(3 * 2 ** 20))\n"),
}

_RUNNER_FRAMES = re.compile(
    r"\n    at (Immediate\.<anonymous> \(file:///sandcell/node_runner\.mjs|"
    r"process\.processImmediate|node:internal/main/run_main_module)[^\n]*"
)


@pytest.fixture(scope="module")
def node_built() -> None:
    runtime_required("node")


def _node_ready(ex: Executor) -> int:
    stats = ex.backend.warm_stats()
    node = getattr(stats, "node_pool", None)
    assert node is not None, f"no Node pool: {stats}"
    return int(node.ready)


def pooled_run(ex: Executor, request: RunRequest) -> tuple[RunResult, str]:
    """``request`` from the Node pool: a first run of its shape may start cold (the pool then
    fills for it), the next one waits for a ready sandbox. Also returns the cold start's why."""
    first = ex.run(request)
    if first.start.mode == "pool":
        return first, ""
    deadline = time.monotonic() + 120
    while _node_ready(ex) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    second = ex.run(request)
    assert second.start.mode == "pool", second.enforcement.layers.get("warm_start")
    return second, first.enforcement.layers["warm_start"]


def test_a_pooled_run_is_warm_and_is_what_node_main_js_runs(
    node_built: None, executor: Executor, executor_pool: Executor
) -> None:
    """Each program pooled and cold: the same outcome, status, stdout and stderr (a stack's
    frames below the program's aside), exports, output cap; the record says pool, and the
    runtime."""
    for name, (language, code) in PROGRAMS.items():
        request = RunRequest(code=code, language=language, exports=("*.txt",))  # type: ignore[arg-type]
        warm, _ = pooled_run(executor_pool, request)
        cold = executor.run(request)
        assert cold.start.mode == "cold"
        shown = f"{name}: pooled {warm.outcome} {warm.reason} {warm.stderr!r}"
        assert (warm.outcome, warm.exit_code, warm.stdout) == (
            cold.outcome,
            cold.exit_code,
            cold.stdout,
        ), f"{shown}; cold {cold.outcome} {cold.reason} {cold.stdout!r} {cold.stderr!r}"
        assert _RUNNER_FRAMES.sub("", warm.stderr) == _RUNNER_FRAMES.sub("", cold.stderr), shown
        assert [a.path for a in warm.artifacts] == [a.path for a in cold.artifacts], shown
        assert warm.start.template and warm.start.template.startswith("node-"), warm.start
        assert "Node waiting" in warm.enforcement.layers["warm_start"]
        assert warm.usage.cpu_ms and warm.usage.peak_memory_bytes, warm.usage
    # What the table's programs showed, said once plainly.
    esm, _ = pooled_run(executor_pool, RunRequest(code=PROGRAMS["esm"][1], language="javascript"))
    assert esm.stdout == "file:///sandcell/main.js 2 undefined\n"
    thrown, _ = pooled_run(
        executor_pool, RunRequest(code=PROGRAMS["throw"][1], language="javascript")
    )
    assert (thrown.outcome.value, thrown.exit_code) == ("error", 1)
    assert "/sandcell/main.js:2" in thrown.stderr and "Error: boom" in thrown.stderr


def test_what_the_pool_cannot_serve_starts_cold_and_says_why(
    node_built: None, executor_pool: Executor
) -> None:
    """Standard input, another shape (the memory limit), the rlimits mode: cold, with the reason
    recorded; the wall time is the run's own (not the shape's) and ends a pooled run, and the
    pool fills for the shape last asked for."""
    base = RunRequest(code="console.log(1)", language="javascript")
    ok, _ = pooled_run(executor_pool, base)
    assert ok.stdout == "1\n"
    stdin = executor_pool.run(RunRequest(code="console.log(1)", language="javascript", stdin=b"x"))
    assert stdin.start.mode == "cold" and "standard input" in stdin.enforcement.layers["warm_start"]
    bigger = RunRequest(
        code="console.log(2)", language="javascript", limits=Limits(memory_bytes=600 * 2**20)
    )
    moved = executor_pool.run(bigger)
    assert moved.stdout == "2\n" and moved.start.mode == "cold"
    assert "no pooled sandbox of this run's shape" in moved.enforcement.layers["warm_start"]
    rlimits = executor_pool.run(
        RunRequest(code="console.log(3)", language="javascript", mode=IsolationMode.RLIMITS)
    )
    assert rlimits.stdout == "3\n" and rlimits.start.mode == "cold"
    assert "rlimits mode starts cold" in rlimits.enforcement.layers["warm_start"]
    loop, _ = pooled_run(
        executor_pool,
        RunRequest(
            code="while (true) {}",
            language="javascript",
            limits=Limits(memory_bytes=600 * 2**20, wall_time_s=1),
        ),
    )
    assert (loop.outcome.value, loop.reason) == ("timeout", "wall-time limit of 1 s reached")


def test_a_closed_pool_leaves_no_sandbox(
    node_built: None, root_home: Path, request: pytest.FixtureRequest
) -> None:
    """The waiting sandboxes say so in a listing (the suite's host scans leave them alone), a
    taken one is used once, those started after a TypeScript run are made for TypeScript, and
    ``close`` ends them all with their run directories."""
    from tests.integration.hostscan import children_of, waiting_in_a_pool

    if os.geteuid() != 0:
        pytest.skip("the in-process executor runs as root; this test run is not root")
    me = os.getpid()

    def waiting() -> dict[int, str]:
        return {
            p.pid: p.cmdline
            for p in children_of(me)
            if p.comm == "bwrap" and "node_runner.mjs" in p.cmdline
        }

    # The suite's own pools full and idle first (the session-wide Node pool included): their
    # waiting sandboxes stay what they are.
    settle_pools(request.getfixturevalue("ladder_executors"))
    settle_pools({("namespaces", "pool"): request.getfixturevalue("executor_pool")})
    before = waiting()
    ex = Executor(
        home=root_home,
        profile="unchecked",
        warm=WarmConfig(mode="pool", pool_size=2, preload=()),
    )
    root = Path(ex.backend.root)  # type: ignore[attr-defined]
    dirs_before = set(root.glob("*/nodepool-*"))  # the session-wide pool's, if any
    try:
        js = RunRequest(code="console.log(1)", language="javascript")
        assert ex.run(js).start.mode == "cold"  # the pool starts with the first run
        settle_pools({("namespaces", "pool"): ex})
        mine = {pid: c for pid, c in waiting().items() if pid not in before}
        assert len(mine) == 2 and all(waiting_in_a_pool(c) for c in mine.values()), mine
        assert ex.run(js).start.mode == "pool"
        settle_pools({("namespaces", "pool"): ex})
        stats = ex.backend.warm_stats().node_pool  # type: ignore[union-attr]
        assert (stats.taken, stats.ready, stats.size) == (1, 2, 2), stats
        # After a TypeScript run the next sandboxes load the type stripper ahead, and say so.
        ts = RunRequest(code="console.log(1 as number)", language="typescript")
        assert ex.run(ts).stdout == "1\n"
        assert ex.run(ts).stdout == "1\n"
        settle_pools({("namespaces", "pool"): ex})
        ts_ready = [c for pid, c in waiting().items() if pid not in before]
        assert ts_ready and all(c.endswith(" typescript pooled") for c in ts_ready), ts_ready
        assert all(waiting_in_a_pool(c) for c in ts_ready)
    finally:
        ex.close()
    assert set(waiting()) <= set(before)
    assert set(root.glob("*/nodepool-*")) <= dirs_before
