"""Live output on every rung: a run's stdout and stderr reach ``on_output`` while it runs.

Liveness is proven without timing: the program prints a line and then sleeps far longer than
the test waits; the listener stops the run (or interrupts the session's cell) when it sees that
line. Only output delivered while the program is still running can do that: output handed over
at the end would find nothing left to stop. Redaction across reads and the caps are checked on
the same real sandboxes, root through the in-process executor and the unprivileged user through
an executor started as that user.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import (
    SANDBOX_PARAMS,
    UnprivEnv,
    backend_unavailable,
    ladder_executor,
    parse_sandbox_param,
)

from sandcell import Executor, Limits, Outcome, RunRequest
from sandcell.live_output import Stream

TOKEN = "ghp_" + "Zq8Rk2Lm4Np6Tr8Vx0Bz2Dc4Fg6Hj8Kl0Mn2Pq"

FIRST_THEN_WAIT = """
import sys, time
print("first line")
print("on stderr", file=sys.stderr)
time.sleep(300)
print("never printed")
"""

# The token in two writes with a pause between (the host reads them apart, usually).
SPLIT = f"""
import sys, time
sys.stdout.write("token={TOKEN[:9]}")
sys.stdout.flush()
time.sleep(0.3)
sys.stdout.write("{TOKEN[9:]} end\\n")
sys.stderr.write("warn {TOKEN[:20]}")
sys.stderr.flush()
time.sleep(0.3)
sys.stderr.write("{TOKEN[20:]}\\n")
"""
# More output than the cap allows (a run of its own: the cap stops the run, and what the other
# stream had not been read by then is not the point here).
FLOOD = """
for i in range(200):
    print(f"line {i:04d} " + "x" * 40)
"""


class Listener:
    """Records what it is told; on the first line, runs ``on_first`` (once)."""

    def __init__(self) -> None:
        self.events: list[tuple[Stream, str]] = []
        self.on_first: list[object] = []
        self.stopped: bool | None = None
        self.lock = threading.Lock()

    def __call__(self, stream: Stream, text: str) -> None:
        with self.lock:
            self.events.append((stream, text))
            if "first line" in text and self.stopped is None and self.on_first:
                stop = self.on_first[0]
                assert callable(stop)
                self.stopped = bool(stop())

    def text(self, stream: Stream) -> str:
        return "".join(t for s, t in self.events if s == stream)


def _root_executor(request: pytest.FixtureRequest, root_home: Path) -> Executor:
    _, backend, start = parse_sandbox_param(str(request.param))
    if backend == "namespaces":
        ex: Executor = request.getfixturevalue(
            "executor" if start == "cold" else f"executor_{start}"
        )
        return ex
    return ladder_executor(request.getfixturevalue("ladder_executors"), root_home, backend, start)


ROOT_PARAMS = [p for p in SANDBOX_PARAMS if p.startswith("root")]
USER_PARAMS = [p for p in SANDBOX_PARAMS if p.startswith("user")]


@pytest.fixture(params=ROOT_PARAMS)
def root_ex(request: pytest.FixtureRequest, root_home: Path) -> Executor:
    return _root_executor(request, root_home)


def _stop(ex: Executor, run_id: str) -> bool:
    return ex.cancel(run_id, "first line seen") or ex.cancel_all("first line seen") > 0


def test_first_line_arrives_while_the_run_runs(root_ex: Executor) -> None:
    run_id = os.urandom(8).hex()
    listener = Listener()
    listener.on_first.append(lambda: _stop(root_ex, run_id))
    result = root_ex.run(
        RunRequest(code=FIRST_THEN_WAIT, limits=Limits(wall_time_s=120)),
        run_id=run_id,
        on_output=listener,
    )
    assert listener.stopped is True, (result.outcome, result.reason, listener.events)
    assert result.outcome is Outcome.KILLED
    assert result.reason.startswith("cancelled: first line seen")
    assert listener.text("stdout") == result.stdout == "first line\n"
    assert "never printed" not in listener.text("stdout")


def test_live_output_is_redacted_across_reads_and_capped(root_ex: Executor) -> None:
    listener = Listener()
    # Held partial lines are released only at the end: what is seen cannot depend on timing.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sandcell.live_output.PARTIAL_AFTER_S", 600.0)
        mp.setattr("sandcell.live_output.WORD_AFTER_S", 600.0)
        result = root_ex.run(RunRequest(code=SPLIT), on_output=listener)
    out, err = listener.text("stdout"), listener.text("stderr")
    for seen in (out, err):
        assert TOKEN not in seen and TOKEN[9:] not in seen and TOKEN[20:] not in seen
    assert out == result.stdout == "token=[REDACTED:github_token] end\n"
    assert err == result.stderr == "warn [REDACTED:github_token]\n"

    capped = Listener()
    limits = Limits(stdout_bytes=2000)
    result = root_ex.run(RunRequest(code=FLOOD, limits=limits), on_output=capped)
    assert result.stdout_truncated
    assert 0 < len(capped.text("stdout").encode()) <= limits.stdout_bytes
    assert capped.text("stdout") == result.stdout


@pytest.mark.parametrize("backend", ["namespaces", "gvisor", "microvm"])
def test_session_cell_output_arrives_while_the_cell_runs(
    backend: str,
    executor: Executor,
    ladder_executors: dict[tuple[str, str], Executor],
    root_home: Path,
) -> None:
    ex = (
        executor
        if backend == "namespaces"
        else ladder_executor(ladder_executors, root_home, backend, "cold")
    )
    cell = (
        "import time\nprint('first line')\ntry:\n    time.sleep(300)\n"
        "except KeyboardInterrupt:\n    print('after the interrupt')\n"
    )
    with ex.session(limits=Limits(wall_time_s=120)) as session:
        listener = Listener()
        listener.on_first.append(lambda: session.cancel("first line seen"))
        result = session.run(cell, on_output=listener)
        assert listener.stopped is True, (result.outcome, result.reason, listener.events)
        # What follows the interrupt depends on how soon the kernel takes it (a kernel that
        # does not answer within the grace is ended): only what was told live is checked.
        assert listener.text("stdout") == result.stdout
        assert result.stdout.startswith("first line\n")


# -- the unprivileged user: an executor started as that user --------------------------------

_USER_PROBE = """
import json, sys
from sandcell import Executor, IsolationMode, Limits, RunRequest
from sandcell.backends.namespaces import WarmConfig

backend, start, mode, run_id = sys.argv[1:5]
warm = None if start == "cold" else WarmConfig(mode=start, pool_size=1)
events, stopped = [], []
with Executor(profile="unchecked", backend=backend, warm=warm) as ex:
    def on_output(stream, text):
        events.append([stream, text])
        if "first line" in text and not stopped:
            stopped.append(ex.cancel(run_id, "first line seen") or ex.cancel_all("x") > 0)
    request = RunRequest(
        code=sys.stdin.read(), limits=Limits(wall_time_s=120), mode=IsolationMode(mode)
    )
    r = ex.run(request, run_id=run_id, on_output=on_output)
print(json.dumps({"outcome": r.outcome.value, "reason": r.reason, "stdout": r.stdout,
                  "events": events, "stopped": stopped}))
"""


@pytest.fixture(params=USER_PARAMS)
def user_param(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    _, backend, start = parse_sandbox_param(str(request.param))
    yield backend, start


def test_first_line_arrives_while_the_run_runs_as_unprivileged_user(
    user_param: tuple[str, str], unpriv: UnprivEnv, tmp_path: Path
) -> None:
    import subprocess

    backend, start = user_param
    probe = unpriv.home / "live_probe.py"
    probe.write_text(_USER_PROBE)
    os.chown(probe, *_ids(unpriv.user))
    cmd = [
        "runuser", "-u", unpriv.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={unpriv.home}", f"PYTHONPATH={unpriv.pythonpath}",
        f"SANDCELL_HOME={unpriv.home}", f"SANDCELL_RUNS={unpriv.runs}",
        unpriv.python, str(probe), backend, start, unpriv.mode.value, os.urandom(8).hex(),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, input=FIRST_THEN_WAIT.encode(), capture_output=True, timeout=300, check=False
    )
    if proc.returncode != 0 and b"is unavailable" in proc.stderr and backend != "namespaces":
        backend_unavailable(backend, proc.stderr.decode(errors="replace").strip()[-500:])
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    got = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert got["stopped"] == [True], got
    assert got["outcome"] == "killed"
    assert got["reason"].startswith("cancelled: first line seen")
    assert "".join(t for s, t in got["events"] if s == "stdout") == got["stdout"] == "first line\n"


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
