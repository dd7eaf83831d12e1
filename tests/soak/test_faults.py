"""Faults, each ending in a defined outcome (a result, a clear error, or a safe retry) and never
in a lost or duplicated result, a silently broken chain, or something left behind.

docs/soak.md lists what each test covers and what it does not."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from tests.conftest import backend_unavailable

from sandcell import _sqlite
from sandcell.audit import AuditLog
from sandcell.errors import AuditError, IsolationUnavailable
from sandcell.executor import Executor
from sandcell.spec import Limits, Outcome, RunRequest

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
RUNGS = pytest.mark.parametrize("backend", ["namespaces", "gvisor", "microvm"])


def _executor(home: Path, backend: str) -> Executor:
    """A cold executor of ``backend`` (the fault tests on every rung), skipped where the host
    cannot run it (failed where CI requires it)."""
    try:
        return Executor(home=home, profile="unchecked", backend=backend)
    except IsolationUnavailable as exc:
        backend_unavailable(backend, str(exc))
        raise


def _env(home: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SANDCELL_HOME": str(home), "TMPDIR": str(tmp), **extra}
    env.pop("SANDCELL_BACKEND", None)
    return env


def _sandcell(home: Path, tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandcell", *args],
        cwd=REPO,
        env=_env(home, tmp, **extra),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _records(home: Path) -> Counter[str]:
    with AuditLog(home / "audit.sqlite3") as audit:
        assert audit.verify().ok, audit.verify()
        return Counter(e.run_id for e in audit.list(limit=1_000_000))


def _owner_left(soak: ModuleType, tmp: Path, tag: str) -> dict[str, list[str]]:
    """What a dead supervisor (``tag``) still has on the host."""
    empty = soak.Snapshot((), (), frozenset(), ())
    left: dict[str, list[str]] = soak.leftovers(empty, soak.snapshot(tmp, [tag]))
    left["temp"] = [t for t in left["temp"] if f"/{tag}" in f"/{t}"]
    left.pop("mounts")
    mounts = Path("/proc/self/mountinfo").read_text()
    left["mounts"] = [line for line in mounts.splitlines() if tag in line]
    return left


# --- the supervising process SIGKILLed ------------------------------------------------------


def _tasks(path: Path, count: int) -> None:
    lines = [
        {
            "id": f"t{i}",
            "code": f"import time\ntime.sleep(0.4)\nprint({i})",
            "expected_stdout": str(i),
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _batch(tasks: Path, home: Path, tmp: Path, start: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandcell",
            "batch",
            str(tasks),
            "--concurrency",
            "4",
            "--profile",
            "unchecked",
            "--start",
            start,
            "--json",
        ],
        cwd=REPO,
        env=_env(home, tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(results: Path) -> list[dict[str, object]]:
    return [json.loads(raw) for raw in results.read_text().splitlines() if raw.strip()]


@pytest.mark.parametrize("start", ["cold", "pool"])
def test_batch_sigkilled_mid_batch_resumes_without_loss_or_duplicates(
    soak: ModuleType, private_tmp: Path, tmp_path: Path, start: str
) -> None:
    home, tasks = tmp_path / "home", tmp_path / "tasks.jsonl"
    results = tmp_path / "tasks.results.jsonl"
    _tasks(tasks, 24)
    proc = _batch(tasks, home, private_tmp, start)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and len(_lines(results)) >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the batch ended before it could be killed: {proc.communicate()}"
    tag = soak.owner_tag(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    done_before = {str(line["id"]) for line in _lines(results)}
    assert 6 <= len(done_before) < 24

    rerun = _sandcell(
        home,
        private_tmp,
        "batch",
        str(tasks),
        "--concurrency",
        "4",
        "--profile",
        "unchecked",
        "--start",
        start,
        "--json",
    )
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["complete"] is True
    assert summary["skipped"] == len(done_before)
    lines = _lines(results)
    ids = Counter(str(line["id"]) for line in lines)
    assert ids == Counter({f"t{i}": 1 for i in range(24)})  # none lost, none twice
    assert all(line["passed"] is True for line in lines)
    records = _records(home)
    # Every result line names a run with exactly one record; a run that finished as the kill
    # came may have a record without a line (its task ran again): never the other way round.
    assert all(records[str(line["run_id"])] == 1 for line in lines)
    assert all(n == 1 for n in records.values())
    # The second batch swept what the killed one left: its runs' directories, cgroups, mounts,
    # and processes.
    assert _owner_left(soak, private_tmp, tag) == {
        "processes": [],
        "cgroups": [],
        "temp": [],
        "mounts": [],
    }


@RUNGS
def test_run_sigkilled_mid_run_leaves_no_record_and_is_swept(
    soak: ModuleType, private_tmp: Path, tmp_path: Path, backend: str
) -> None:
    home = tmp_path / "home"
    _executor(home, backend).close()  # skipped where the host cannot run this rung
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandcell",
            "run",
            "--backend",
            backend,
            "--profile",
            "unchecked",
            "--timeout",
            "60",
            "-c",
            "import time\nprint('started', flush=True)\ntime.sleep(60)",
        ],
        cwd=REPO,
        env=_env(home, private_tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    tag = soak.owner_tag(proc.pid)
    while time.monotonic() < deadline:
        if soak.snapshot(private_tmp, [tag]).cgroups:
            break  # the sandbox is in its run cgroup: the run is under way
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"the run never started: {proc.communicate()}")
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # The killed run has no result and no record: nothing claims it finished.
    assert _records(home) == Counter()
    # The next sandcell start sweeps what the dead supervisor left, and runs normally.
    after = _sandcell(
        home, private_tmp, "run", "--backend", backend, "--profile", "unchecked", "-c", "print(1)"
    )
    assert after.returncode == 0, after.stderr
    assert list(_records(home).values()) == [1]
    assert _owner_left(soak, private_tmp, tag) == {
        "processes": [],
        "cgroups": [],
        "temp": [],
        "mounts": [],
    }


# --- the results file truncated ---------------------------------------------------------------


def test_results_file_truncated_mid_line_reruns_that_task_once(
    private_tmp: Path, tmp_path: Path
) -> None:
    home, tasks = tmp_path / "home", tmp_path / "tasks.jsonl"
    results = tmp_path / "tasks.results.jsonl"
    _tasks(tasks, 6)
    first = _sandcell(
        home,
        private_tmp,
        "batch",
        str(tasks),
        "--profile",
        "unchecked",
        "--start",
        "cold",
        "--json",
    )
    assert first.returncode == 0, first.stderr
    data = results.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut_id = json.loads(data[last_start:])["id"]
    results.write_bytes(data[: last_start + 25])  # a torn write: half of the last line

    second = _sandcell(
        home,
        private_tmp,
        "batch",
        str(tasks),
        "--profile",
        "unchecked",
        "--start",
        "cold",
        "--json",
    )
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["complete"] is True
    assert summary["ran"] == 1 and summary["skipped"] == 5
    lines = _lines(results)  # every line parses: the fragment was cut off
    assert Counter(str(line["id"]) for line in lines) == Counter({f"t{i}": 1 for i in range(6)})
    assert str(lines[-1]["id"]) == cut_id
    records = _records(home)
    assert all(records[str(line["run_id"])] == 1 for line in lines)


def test_results_file_damaged_mid_file_is_a_clear_error(private_tmp: Path, tmp_path: Path) -> None:
    home, tasks = tmp_path / "home", tmp_path / "tasks.jsonl"
    results = tmp_path / "tasks.results.jsonl"
    _tasks(tasks, 2)
    results.write_text('{"id": "t0", "outcome": "ok", "pass\n{"id": "t1"}\n')
    out = _sandcell(home, private_tmp, "batch", str(tasks), "--profile", "unchecked")
    assert out.returncode != 0
    assert "line 1 is not valid JSON" in out.stderr
    assert not (home / "audit.sqlite3").exists() or _records(home) == Counter()


# --- the audit database locked by another process, and corrupted ----------------------------


class _Holder:
    """Another process holding ``BEGIN EXCLUSIVE`` on a SQLite file until :meth:`release`."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys\n"
                "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                "c.execute('BEGIN EXCLUSIVE')\n"
                "print('locked', flush=True)\n"
                "sys.stdin.read()\n"
                "c.execute('ROLLBACK')\n",
                str(db),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "locked\n"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0
        self.proc.stdout.close()

    def kill(self) -> None:
        """Cleanup after a failure: end it whatever it is doing."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def test_audit_locked_past_the_busy_timeout_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_S", 1.0)
    with Executor(home=home, profile="unchecked") as ex:
        holder = _Holder(home / "audit.sqlite3")
        try:
            with pytest.raises(AuditError, match="locked"):
                ex.run(RunRequest(code="print(1)"))
            holder.release()
        finally:
            holder.kill()
        after = ex.run(RunRequest(code="print(2)"))
    assert after.outcome is Outcome.OK
    # The run whose record could not be written raised instead of returning a result: the one
    # result there is has its record, and the chain is whole.
    assert _records(home) == Counter({after.run_id: 1})


def test_audit_locked_briefly_waits_and_records(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Executor(home=home, profile="unchecked") as ex:
        holder = _Holder(home / "audit.sqlite3")
        timer = threading.Timer(1.0, holder.release)
        timer.start()
        try:
            result = ex.run(RunRequest(code="import time; time.sleep(0.2)"))
        finally:
            timer.join()
            holder.kill()
    assert result.outcome is Outcome.OK
    assert _records(home) == Counter({result.run_id: 1})


def test_audit_locked_when_a_store_opens_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    AuditLog(home / "audit.sqlite3").close()
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_S", 1.0)
    holder = _Holder(home / "audit.sqlite3")
    try:
        with pytest.raises(AuditError, match="still locked by another sandcell process"):
            Executor(home=home, profile="unchecked")
        holder.release()
    finally:
        holder.kill()


def _three_runs(home: Path) -> list[str]:
    with Executor(home=home, profile="unchecked") as ex:
        return [ex.run(RunRequest(code=f"print({i})")).run_id for i in range(3)]


def test_audit_record_edited_is_named_by_verify(private_tmp: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ids = _three_runs(home)
    with sqlite3.connect(home / "audit.sqlite3") as conn:
        conn.execute("UPDATE runs SET record = replace(record, '\"ok\"', '\"0k\"') WHERE seq = 2")
    out = _sandcell(home, private_tmp, "audit", "verify")
    assert out.returncode != 0
    assert f"changed: seq 2 run {ids[1]}" in out.stdout, out.stdout + out.stderr


def test_audit_bytes_flipped_inside_a_record_are_named_by_verify(
    private_tmp: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    ids = _three_runs(home)
    db = home / "audit.sqlite3"
    data = db.read_bytes()
    # Bit rot in the stored text of the second record, below SQLite (the file, not a query).
    at = data.index(b'"code":"print(1)"') + len(b'"code":"print(')
    db.write_bytes(data[:at] + bytes([data[at] ^ 0x06]) + data[at + 1 :])
    with AuditLog(db) as audit:
        report = audit.verify()
    assert not report.ok
    assert [p.seq for p in report.problems] == [2], report
    out = _sandcell(home, private_tmp, "audit", "verify")
    assert out.returncode != 0
    assert f"changed: seq 2 run {ids[1]}" in out.stdout


def test_audit_file_with_flipped_bytes_is_a_clear_error(private_tmp: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _three_runs(home)
    db = home / "audit.sqlite3"
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    data = bytearray(db.read_bytes())
    # Flip every byte of the second page (the runs table's first leaf): a disk error, not an
    # edit through SQLite.
    page = int.from_bytes(data[16:18], "big") or 65536
    for i in range(page, 2 * page):
        data[i] ^= 0xFF
    db.write_bytes(bytes(data))
    out = _sandcell(home, private_tmp, "audit", "verify")
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert str(db) in said and "malformed" in said, said
    assert "Traceback" not in said
    # New runs are not chained onto a log that cannot be read: a clear error, not a new chain.
    run = _sandcell(home, private_tmp, "run", "--profile", "unchecked", "-c", "print(1)")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert str(db) in run.stderr, run.stderr


# --- the data directory full ------------------------------------------------------------------


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("mount") is None:
        pytest.skip("mount is not installed")
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "sandcell-soak", str(home)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {done.stderr.strip()}")
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def test_data_directory_full_ends_in_clear_outcomes_and_a_whole_chain(
    small_home: Path,
) -> None:
    export = RunRequest(
        code="import os; open('out.bin', 'wb').write(os.urandom(600_000))", exports=("out.bin",)
    )
    returned = []
    errors = []
    with Executor(home=small_home, profile="unchecked") as ex:
        for _ in range(10):
            try:
                returned.append(ex.run(export))
            except AuditError as exc:
                errors.append(str(exc))
        # Nothing left at all: even the record cannot be written.
        filler = small_home / "filler"
        with filler.open("wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        try:
            returned.append(ex.run(RunRequest(code="print(1)")))
        except AuditError as exc:
            errors.append(str(exc))
        filler.unlink()
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_home)], check=True)
        again = ex.run(export)
    outcomes = Counter(r.outcome for r in returned)
    assert outcomes[Outcome.OK] >= 1
    full = [r for r in returned if r.outcome is not Outcome.OK]
    assert full, "the data directory never filled"
    for r in full:
        # A result that says why, never an OK run missing its artifact.
        assert r.outcome is Outcome.INFRA_ERROR
        assert "No space left" in (r.reason or "")
    for message in errors:
        assert "No space left" in message or "full" in message, message
    assert again.outcome is Outcome.OK and [a.path for a in again.artifacts] == ["out.bin"]
    records = _records(small_home)  # verifies the chain
    assert all(records[r.run_id] == 1 for r in [*returned, again])
    # No half-written artifact stays in the store's incoming area.
    incoming = [p for p in (small_home / "artifacts").rglob("put-*")]
    assert incoming == []


# --- the host clock stepped back ---------------------------------------------------------------


def test_clock_stepped_back_keeps_the_chain_in_append_order(
    private_tmp: Path, tmp_path: Path
) -> None:
    if not FAKETIME.exists():
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    home = tmp_path / "home"
    first = _sandcell(home, private_tmp, "run", "--profile", "unchecked", "-c", "print(1)")
    assert first.returncode == 0, first.stderr
    # This process's clocks start a day behind the first one's (libfaketime shifts realtime and
    # monotonic by the same offset; with monotonic left alone its sleeps fail with EINVAL). A
    # step inside one process's life is not modelled: see docs/soak.md.
    stepped = _sandcell(
        home,
        private_tmp,
        "run",
        "--profile",
        "unchecked",
        "-c",
        "print(2)",
        LD_PRELOAD=str(FAKETIME),
        FAKETIME="-1d",
    )
    assert stepped.returncode == 0, stepped.stderr
    assert stepped.stdout.strip() == "2"
    with AuditLog(home / "audit.sqlite3") as audit:
        assert audit.verify().ok
        newest, older = audit.list(limit=2)
    assert (newest.seq, older.seq) == (2, 1)
    # The step shows in the timestamps, not in the chain: order is the append order.
    assert str(newest.record["started_at"]) < str(older.record["started_at"])
    assert newest.created_at < older.created_at


# --- sandboxes that fight back ------------------------------------------------------------------


@RUNGS
def test_sandbox_ignoring_every_signal_is_killed_at_its_deadline(
    soak: ModuleType, private_tmp: Path, tmp_path: Path, backend: str
) -> None:
    me = os.getpid()
    before = soak.snapshot(private_tmp, [soak.owner_tag(me)], [me])
    with _executor(tmp_path / "home", backend) as ex:
        result = ex.run(soak.SIGNAL_PROOF)
    assert result.outcome is Outcome.TIMEOUT
    assert result.signal == signal.SIGKILL
    after = soak.snapshot(private_tmp, [soak.owner_tag(me)], [me])
    assert soak.leftovers(before, after) == {
        "processes": [],
        "cgroups": [],
        "mounts": [],
        "temp": [],
    }


@RUNGS
def test_workspace_full_is_a_clear_outcome(soak: ModuleType, tmp_path: Path, backend: str) -> None:
    with _executor(tmp_path / "home", backend) as ex:
        result = ex.run(
            RunRequest(
                code="f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
                limits=Limits(workspace_bytes=8 * MiB),
                exports=("big",),
            )
        )
    assert result.outcome is Outcome.ERROR
    assert "No space left on device" in result.stderr
    # What was written up to the limit is held to it (or refused), never more.
    assert all(a.size <= 8 * MiB for a in result.artifacts)


def test_results_file_on_a_full_disk_keeps_whole_lines(small_home: Path) -> None:
    from sandcell.batch.results import ResultsFile
    from sandcell.errors import InfraError

    path = small_home / "results.jsonl"
    filler = small_home / "filler"
    with ResultsFile(path) as results:
        results.append({"id": "a", "outcome": "ok", "passed": True})
        with filler.open("wb") as f:
            f.write(b"\0" * (4 * MiB - 64 * 1024))  # leave less than the next line needs
        with pytest.raises(InfraError, match="runs again when the batch is resumed"):
            results.append({"id": "b", "outcome": "ok", "passed": True, "stdout": "x" * 200_000})
        filler.unlink()
        results.append({"id": "c", "outcome": "ok", "passed": True})
    with ResultsFile(path) as reopened:
        assert sorted(reopened.recorded) == ["a", "c"]
        assert reopened.truncated_line is None


def test_service_sigkilled_mid_run_is_swept_on_restart(
    soak: ModuleType, private_tmp: Path, tmp_path: Path
) -> None:
    pytest.importorskip("uvicorn", reason="the service extra is not installed")
    from sandcell.client import Client
    from sandcell.errors import SandcellError
    from sandcell.service.tenants import TenantStore

    home = tmp_path / "home"
    home.mkdir()
    with TenantStore.in_home(home) as store:
        _, key = store.add(
            "soak",
            profiles=("unchecked",),
            max_concurrent=4,
            runs_per_minute=600,
            cpu_seconds_per_day=3600,
            max_stored_bytes=64 * MiB,
        )
    serve = soak.Serve.start(home, "--start", "cold")
    tag = soak.owner_tag(serve.proc.pid)
    outcome: list[object] = []

    def long_run() -> None:
        with Client(serve.url, key, timeout=120) as client:
            try:
                outcome.append(client.run(RunRequest(code="import time; time.sleep(60)")))
            except SandcellError as exc:
                outcome.append(exc)

    caller = threading.Thread(target=long_run)
    caller.start()
    try:
        deadline = time.monotonic() + 120
        while not soak.snapshot(private_tmp, [tag]).cgroups:
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        serve.proc.send_signal(signal.SIGKILL)
        caller.join(60)
    finally:
        serve.stop()
    # The caller is told the service went away: an error, never a result.
    assert len(outcome) == 1 and isinstance(outcome[0], SandcellError), outcome
    assert _records(home) == Counter()

    again = soak.Serve.start(home, "--start", "cold")
    try:
        with Client(again.url, key, timeout=120) as client:
            after = client.run(RunRequest(code="print(1)"))
    finally:
        again.stop()
    assert after.outcome is Outcome.OK
    assert _records(home) == Counter({after.run_id: 1})
    assert _owner_left(soak, private_tmp, tag) == {
        "processes": [],
        "cgroups": [],
        "temp": [],
        "mounts": [],
    }


def test_service_with_its_data_directory_full_answers_a_clear_error(
    soak: ModuleType, small_home: Path
) -> None:
    pytest.importorskip("uvicorn", reason="the service extra is not installed")
    from sandcell.client import Client
    from sandcell.client.errors import ServiceUnavailable
    from sandcell.service.tenants import TenantStore

    with TenantStore.in_home(small_home) as store:
        _, key = store.add(
            "soak",
            profiles=("unchecked",),
            max_concurrent=4,
            runs_per_minute=600,
            cpu_seconds_per_day=3600,
            max_stored_bytes=64 * MiB,
        )
    serve = soak.Serve.start(small_home, "--start", "cold")
    filler = small_home / "filler"
    try:
        with Client(serve.url, key, timeout=120) as client:
            before = client.run(RunRequest(code="print(1)"))
            with filler.open("wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            with pytest.raises(ServiceUnavailable, match="run records could not be"):
                client.run(RunRequest(code="print(2)"))
            filler.unlink()
            after = client.run(RunRequest(code="print(3)"))
    finally:
        serve.stop()
    assert (before.outcome, after.outcome) == (Outcome.OK, Outcome.OK)
    # The run whose record could not be written was answered with an error, not a result.
    assert _records(small_home) == Counter({before.run_id: 1, after.run_id: 1})


def test_session_server_sigkilled_mid_cell_is_swept(
    soak: ModuleType, private_tmp: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    started = _sandcell(home, private_tmp, "session", "start", "--profile", "unchecked", "--json")
    assert started.returncode == 0, started.stderr
    session = json.loads(started.stdout)
    session_id = str(session.get("id") or session.get("session_id"))
    entry = json.loads((home / "sessions" / f"{session_id}.json").read_text())
    server = int(entry["pid"])
    tag = soak.owner_tag(server)
    cell = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandcell",
            "session",
            "run",
            session_id,
            "--timeout",
            "60",
            "-c",
            "import time\ntime.sleep(60)",
        ],
        cwd=REPO,
        env=_env(home, private_tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # the cell is under way (its end is 60 s off)
    os.kill(server, signal.SIGKILL)
    _, err = cell.communicate(timeout=60)
    assert cell.returncode != 0
    assert "Traceback" not in err and err.strip(), err
    listed = _sandcell(home, private_tmp, "session", "list")  # sweeps dead servers
    assert listed.returncode == 0, listed.stderr
    assert session_id not in listed.stdout
    assert list((home / "sessions").glob(f"{session_id}.*")) == []
    assert _owner_left(soak, private_tmp, tag) == {
        "processes": [],
        "cgroups": [],
        "temp": [],
        "mounts": [],
    }
    if (home / "audit.sqlite3").exists():
        _records(home)  # whatever was recorded, the chain is whole
