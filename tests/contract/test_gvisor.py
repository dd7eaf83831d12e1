"""The gVisor backend's own promises, with real runsc sandboxes.

What the shared contract and escape suites (parametrized over backends) do not show: the program
runs on gVisor's kernel, not the host's; each limit ends the run with its outcome (CPU time
enforced by the host, since gVisor ignores RLIMIT_CPU); nothing is left behind after a timeout,
a cancellation or a supervisor killed by SIGKILL; the warm pool serves what it can and says why
it did not serve the rest.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv, run_as_user

from sandcell import Executor, Limits, Outcome, RunRequest, input_from_path
from sandcell.backends.base import BackendResult
from sandcell.backends.host import cgroups, workspace
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.spec import IsolationMode, MiB

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these tests run as root")


def _backend(warm: WarmConfig | None = None) -> object:
    from sandcell.backends.gvisor import GVisorBackend

    try:
        return GVisorBackend(warm=warm)
    except IsolationUnavailable as exc:
        pytest.skip(f"gVisor is not usable here: {exc}")


@pytest.fixture(scope="module")
def gv() -> Iterator[object]:
    b = _backend()
    yield b
    b.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def gvx(tmp_path_factory: pytest.TempPathFactory, gv: object) -> Iterator[Executor]:
    home = tmp_path_factory.mktemp("gvisor-home")
    with Executor(home=home, profile="unchecked", backend=gv) as ex:  # type: ignore[arg-type]
        yield ex


def _run(gv: object, request: RunRequest, run_id: str = "t") -> BackendResult:
    result: BackendResult = gv.run(  # type: ignore[attr-defined]
        request, run_id=run_id, collect=lambda ws: ((), ())
    )
    return result


def _leftovers(gv: object, name_part: str) -> list[str]:
    """Anything of runs whose container name contains ``name_part``: containers in runsc's
    state, run directories, mounts, cgroups."""
    # Only this process's: other supervisors on the host may run gVisor sandboxes of their own.
    mine = workspace.owner_tag()
    rs = gv.runsc  # type: ignore[attr-defined]
    left = [f"state {n}" for n in os.listdir(rs.state_dir) if n.startswith(mine) and name_part in n]
    owner = workspace.runs_root() / mine
    if owner.is_dir():
        left += [f"run dir {p}" for p in owner.iterdir() if name_part in p.name]
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    left += [f"mount {p}" for p in points if f"/{mine}/" in p and name_part in p]
    host = cgroups.detect()
    if isinstance(host, cgroups.CgroupHost):
        left += [
            f"cgroup {d}"
            for _c, d in cgroups.stale_groups(host)
            if d.name.startswith(mine) and name_part in d.name
        ]
    return left


def test_program_runs_on_gvisors_kernel_not_the_hosts(gvx: Executor) -> None:
    r = gvx.run(
        RunRequest(code="import os; print(open('/proc/version').read()); print(os.uname().release)")
    )
    assert r.outcome is Outcome.OK, r.stderr
    assert "4.4.0" in r.stdout
    assert platform.release() not in r.stdout, "the sandbox saw the host's kernel release"
    assert r.enforcement is not None and r.enforcement.backend == "gvisor"
    assert "runsc" in r.enforcement.layers["gvisor"]


def test_versions_name_runsc_and_platform(gv: object) -> None:
    v = gv.versions()  # type: ignore[attr-defined]
    assert v["runsc_release"] and v["runsc_platform"] and v["runsc_path"]
    assert "runsc version" in v["runsc"]


def test_bash_stdin_env_and_exit_status(gv: object) -> None:
    r = _run(
        gv,
        RunRequest(
            code='read line; echo "$line $GREETING"; id -u; exit 3',
            language="bash",
            stdin=b"hello\n",
            env={"GREETING": "world"},
        ),
    )
    assert r.outcome is Outcome.ERROR and r.exit_code == 3, r.stderr
    assert r.stdout.decode().splitlines() == ["hello world", "1000"]


def test_no_caller_environment(gv: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDCELL_SECRET_FOR_TEST", "do-not-leak")
    r = _run(
        gv,
        RunRequest(
            code="import os; print(sorted(os.environ)); print(open('/proc/1/environ','rb').read())"
        ),
    )
    assert r.outcome is Outcome.OK, r.stderr
    assert b"SANDCELL_SECRET_FOR_TEST" not in r.stdout and b"do-not-leak" not in r.stdout


def test_seccomp_filter_applies_inside_the_sentry(gv: object) -> None:
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(0, 0, None, None), errno.errorcode[ctypes.get_errno()])\n"
        "print([l for l in open('/proc/self/status') if l.startswith('Seccomp')][0].split())\n"
    )
    r = _run(gv, RunRequest(code=code))
    assert r.outcome is Outcome.OK, r.stderr
    # PTRACE_TRACEME: gVisor would emulate it; the policy refuses it as under bubblewrap.
    assert r.stdout.decode().splitlines() == ["-1 EPERM", "['Seccomp:', '2']"]


def test_exit_status_137_is_not_sigkill(gv: object) -> None:
    r = _run(gv, RunRequest(code="raise SystemExit(137)"))
    assert (r.outcome, r.exit_code, r.signal) == (Outcome.ERROR, 137, None), r.reason
    r = _run(gv, RunRequest(code="import os, signal; os.kill(os.getpid(), signal.SIGTERM)"))
    assert (r.outcome, r.exit_code, r.signal) == (Outcome.KILLED, None, 15), r.reason


LIMIT_CASES = {
    "wall_time": (
        "import time; time.sleep(30)",
        Limits(wall_time_s=1),
        Outcome.TIMEOUT,
        "wall-time",
    ),
    "cpu_time": ("while True: pass", Limits(cpu_time_s=1), Outcome.TIMEOUT, "CPU-time"),
    "memory": (
        "x = bytearray(600 * 2**20); print(len(x))",
        Limits(memory_bytes=128 * MiB),
        Outcome.MEMORY_LIMIT,
        "memory limit",
    ),
    "stdout": ("print('x' * 100000)", Limits(stdout_bytes=1000), Outcome.OUTPUT_LIMIT, "stdout"),
    "stderr": (
        "import sys; sys.stderr.write('x' * 100000)",
        Limits(stderr_bytes=1000),
        Outcome.OUTPUT_LIMIT,
        "stderr",
    ),
}


@pytest.mark.parametrize("case", list(LIMIT_CASES))
def test_each_limit_gives_its_outcome(gv: object, case: str) -> None:
    code, limits, outcome, reason = LIMIT_CASES[case]
    r = _run(gv, RunRequest(code=code, limits=limits), run_id=f"limit-{case}")
    assert r.outcome is outcome, (r.reason, r.stderr[-500:])
    assert reason in r.reason
    assert not _leftovers(gv, f"limit-{case}")


ERRNO_CASES = {
    "open_files": (
        "fs = [open('/dev/null') for _ in range(100)]",
        Limits(max_open_files=20),
        "Too many open files",
    ),
    "file_size": (
        "open('big', 'wb').write(b'x' * (4 * 2**20))",
        Limits(max_file_bytes=1 * MiB),
        "File too large",
    ),
    "workspace": (
        "open('big', 'wb').write(b'x' * (12 * 2**20))",
        Limits(workspace_bytes=4 * MiB),
        "No space left on device",
    ),
    "pids": (
        "import subprocess\nps = [subprocess.Popen(['sleep', '5']) for _ in range(40)]",
        Limits(max_pids=8),
        "Resource temporarily unavailable",
    ),
}


@pytest.mark.parametrize("case", list(ERRNO_CASES))
def test_per_process_limits_fail_the_call(gv: object, case: str) -> None:
    code, limits, message = ERRNO_CASES[case]
    r = _run(gv, RunRequest(code=code, limits=limits))
    assert r.outcome is Outcome.ERROR, (r.reason, r.stderr[-500:])
    assert message in r.stderr.decode(), r.stderr[-500:]


def test_inputs_read_only_and_exports(gvx: Executor, tmp_path: Path) -> None:
    src = tmp_path / "sales.csv"
    src.write_text("a,b\n1,2\n")
    code = (
        "import os, errno\n"
        "print(open('sales.csv').read().strip().replace(chr(10), ';'))\n"
        "try:\n    open('/inputs/sales.csv', 'a')\nexcept OSError as e:\n"
        "    print('ro', errno.errorcode[e.errno])\n"
        "os.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('result')\n"
    )
    r = gvx.run(RunRequest(code=code, inputs=(input_from_path(src),), exports=("out/*.txt",)))
    assert r.outcome is Outcome.OK, r.stderr
    assert r.stdout.splitlines()[0] == "a,b;1,2"
    assert r.stdout.splitlines()[1] in ("ro EROFS", "ro EACCES")
    assert [a.path for a in r.artifacts] == ["out/r.txt"]
    assert src.read_text() == "a,b\n1,2\n"


def test_display_outputs(gvx: Executor) -> None:
    r = gvx.run(RunRequest(code="x = 6 * 7\nx", display=True))
    assert r.outcome is Outcome.OK, r.stderr
    assert [o.data.get("text/plain") for o in r.outputs] == ["42"]


def test_nothing_left_after_timeout(gv: object) -> None:
    r = _run(
        gv,
        RunRequest(
            code="import subprocess; subprocess.Popen(['sleep', '60']); "
            "open('/tmp/x', 'w').write('y'); import time; time.sleep(60)",
            limits=Limits(wall_time_s=1),
        ),
        run_id="leftover-timeout",
    )
    assert r.outcome is Outcome.TIMEOUT
    assert not _leftovers(gv, "leftover-timeout")


def test_cancel_all_stops_a_run(gv: object) -> None:
    results: list[BackendResult] = []
    t = threading.Thread(
        target=lambda: results.append(
            _run(gv, RunRequest(code="import time; time.sleep(60)"), run_id="cancel-me")
        )
    )
    t.start()
    deadline = time.monotonic() + 30
    while "cancel-me" not in gv.runs.in_flight() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.02)
    time.sleep(0.5)
    assert gv.cancel_all("test says stop") == 1  # type: ignore[attr-defined]
    t.join(30)
    assert results and results[0].outcome is Outcome.KILLED
    assert results[0].reason == "cancelled: test says stop"
    assert not _leftovers(gv, "cancel-me")


_SUPERVISOR = """
import sys
from sandcell.backends.gvisor import GVisorBackend
from sandcell.spec import RunRequest
b = GVisorBackend()
print("running", flush=True)
request = RunRequest(code="import time; time.sleep(120)")
b.run(request, run_id="orphaned", collect=lambda ws: ((), ()))
"""


def test_sweep_after_supervisor_sigkill(gv: object, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _SUPERVISOR], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"running\n"
    time.sleep(2)  # the sandbox is up and its program sleeping
    owner = f"{proc.pid}-"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    rs = gv.runsc  # type: ignore[attr-defined]
    assert any(n.startswith(owner) for n in os.listdir(rs.state_dir)), "no container to sweep"
    from sandcell.backends.gvisor import sweep

    removed = sweep(rs)
    assert any("orphaned" in r for r in removed), removed
    assert not [n for n in os.listdir(rs.state_dir) if n.startswith(owner)]
    runs = [p for p in workspace.runs_root().iterdir() if p.name.startswith(owner)]
    assert not runs, runs
    with open("/proc/self/mountinfo") as f:
        assert not [line for line in f if f"/{owner}" in line]
    host = cgroups.detect()
    if isinstance(host, cgroups.CgroupHost):
        assert not [d for _c, d in cgroups.stale_groups(host) if d.name.startswith(owner)]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert f"{proc.pid}-" not in ps, "a runsc process of the dead supervisor is still running"


def test_strict_mode_needs_cgroups_rlimits_mode_is_recorded(gv: object) -> None:
    r = _run(gv, RunRequest(code="print(1)", mode=IsolationMode.RLIMITS))
    assert r.outcome is Outcome.OK
    assert any("RLIMIT_AS" in w for w in r.enforcement.weakened)


def test_requiring_landlock_fails_closed(gv: object) -> None:
    with pytest.raises(IsolationUnavailable, match="landlock"):
        _run(gv, RunRequest(code="print(1)", landlock=True))


def test_pool_serves_and_says_why_not() -> None:
    b = _backend(WarmConfig(mode="pool", preload=(), pool_size=1))
    # This pool's own sandboxes: other backends of this process (the suite's shared executors)
    # keep pools of their own.
    mine = f"pool-{b._pool.id}"  # type: ignore[attr-defined]
    try:
        r = _run(b, RunRequest(code="import os; print(os.uname().release)"), run_id="pooled")
        assert r.outcome is Outcome.OK and r.stdout == b"4.4.0\n", r.stderr
        assert r.start.mode == "pool"
        r = _run(
            b,
            RunRequest(code="print(open('/inputs/x').read())", inputs=(input_from_path(__file__),)),
            run_id="not-pooled",
        )
        assert r.start.mode == "cold"
        assert "inputs" in r.enforcement.layers["warm_start"]
        r = _run(b, RunRequest(code="while True: pass", limits=Limits(cpu_time_s=1)), run_id="pc")
        assert r.outcome is Outcome.TIMEOUT and "CPU" in r.reason
        assert r.start.mode == "pool"
    finally:
        b.close()  # type: ignore[attr-defined]
    assert not _leftovers(b, mine)


def test_template_mode_is_refused() -> None:
    from sandcell.backends.gvisor import GVisorBackend

    with pytest.raises(IsolationUnavailable, match="template"):
        GVisorBackend(warm=WarmConfig(mode="template"))


def test_rootless_run(unpriv: UnprivEnv) -> None:
    proc = run_as_user(
        unpriv,
        ["run", "--backend", "gvisor", "--isolation", "rlimits", "--json", "-c",
         "import os; print(os.uname().release); open('f', 'w').write('x')"],
    )  # fmt: skip
    if b"gvisor is unavailable" in proc.stderr:
        pytest.skip(proc.stderr.decode())
    import json

    doc = json.loads(proc.stdout)
    assert doc["outcome"] == "ok", doc
    assert doc["stdout"] == "4.4.0\n"
    assert doc["enforcement"]["backend"] == "gvisor"
    assert "rootless" in doc["enforcement"]["layers"]["gvisor"]
