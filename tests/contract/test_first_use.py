"""First use of a fresh data directory by several ``sandcell`` processes at once, and the shape of
the CLI's own error lines.

Eight ``sandcell run`` processes are started together on a fresh ``SANDCELL_HOME``: each imports
sandcell, says it is ready, and waits for the same go signal (a file), so that they create the audit
log, the approval store, the artifact store and the run directories at the same moment. Every run
must succeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import run_cli

RUNS = 8

_WAIT_THEN_RUN = """
import os, sys, time
from sandcell.cli import main
import sandcell.executor, sandcell.audit, sandcell.policy.approvals  # imported before the start
barrier, index = sys.argv[1], sys.argv[2]
open(os.path.join(barrier, "ready-" + index), "w").close()
while not os.path.exists(os.path.join(barrier, "go")):
    time.sleep(0.001)
sys.exit(main(sys.argv[3:]))
"""


def test_runs_started_together_on_a_fresh_home_all_succeed(tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "SANDCELL_HOME": str(home), "SANDCELL_RUNS": str(tmp_path / "runs")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WAIT_THEN_RUN, str(barrier), str(i), "run", "--profile",
             "unchecked", "-c", f"print('run', {i})"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(RUNS)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(list(barrier.glob("ready-*"))) < RUNS:
            assert all(p.poll() is None for p in procs), "a process ended before the start"
            assert time.monotonic() < deadline, "the processes did not get ready"
            time.sleep(0.01)
        assert not home.exists(), "the data directory must be fresh at the start"
        (barrier / "go").touch()
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, (out, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode == 0, f"run {i} failed (exit {p.returncode}): {err.decode()}"
        assert out.decode() == f"run {i}\n", (out, err)
    # Every run has its record in the one audit log.
    listed = run_cli(["audit", "list", "--json", "--limit", "100"], env=env)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == RUNS


def test_sandcells_lines_start_and_end_their_own_line(tmp_path: Path) -> None:
    """The program's stderr may end mid-line; sandcell's own lines (here the timeout) never join
    it, and every error line ends with a newline."""
    env = {**os.environ, "SANDCELL_HOME": str(tmp_path / "home")}
    code = "import sys, time\nsys.stderr.write('partial')\nsys.stderr.flush()\ntime.sleep(30)"
    p = run_cli(["run", "--profile", "unchecked", "--timeout", "1", "-c", code], env=env)
    assert p.returncode != 0
    assert p.stderr.startswith("partial\nsandcell: timeout: "), repr(p.stderr)
    assert p.stderr.endswith("\n"), repr(p.stderr)
    for args in (
        ["run", "--profile", "no-such-profile", "-c", "pass"],
        ["run", "--profile", "unchecked", "--export", "/etc/passwd", "-c", "pass"],
        ["audit", "show", "no-such-run"],
    ):
        p = run_cli(args, env=env)
        assert p.returncode != 0, args
        assert p.stderr.startswith("sandcell: "), (args, p.stderr)
        assert p.stderr.endswith("\n"), (args, repr(p.stderr))
