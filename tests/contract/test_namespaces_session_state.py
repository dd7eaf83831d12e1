"""The namespaces rung's pause, snapshot and fork at the cell-sandbox level (issue 23): files only.

Real session sandboxes (``backend.session_sandbox``), as root in this process and as the
ordinary user through a script started with ``runuser`` (the workspace helper's path): a files
pause keeps the workspace (nested directories, an inside link) and drops a link to a host file;
the restored sandbox is a fresh one (no variables) whose files its user owns; a memory pause is
refused; a snapshot leaves the sandbox running (a sleeping child still there); one state restores
twice at once into independent sandboxes without being changed; states crafted by hand (a ``..``
name, an absolute link to a host directory with a file through it) are refused and write nothing;
a save under a writer that keeps replacing a file is never torn where the session can be frozen;
metrics read the session's cgroup and workspace.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandcell.backends.cell import CellRun, CellSandbox
from sandcell.backends.cell.state import PauseMode, PauseRefused, RestorePoint, SavedState
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.backends.namespaces.session import SessionSandbox
from sandcell.errors import ConfigError, InfraError
from sandcell.spec import Limits, MiB, Outcome, RunRequest

if TYPE_CHECKING:
    from tests.conftest import UnprivEnv

REQUEST = RunRequest(code="", limits=Limits(wall_time_s=60.0, workspace_bytes=16 * MiB))

WRITE_FILES = textwrap.dedent(
    """
    import os
    os.makedirs("d/e")
    open("notes.txt", "w").write("kept\\n")
    open("d/e/deep.bin", "wb").write(bytes(range(256)) * 4)
    open("run.sh", "w").write("echo hi\\n")
    os.chmod("run.sh", 0o755)
    os.symlink("/etc/passwd", "pw")
    os.symlink("e/deep.bin", "d/rel")
    x = 41
    """
)

CHECK_FILES = textwrap.dedent(
    """
    import json, os, stat
    seen = {
        "notes": open("notes.txt").read(),
        "deep": open("d/rel", "rb").read() == bytes(range(256)) * 4,
        "rel": os.readlink("d/rel"),
        "pw": os.path.lexists("pw"),
        "run_mode": oct(stat.S_IMODE(os.stat("run.sh").st_mode)),
        "own": os.stat("notes.txt").st_uid == os.getuid() == os.stat("d/e").st_uid,
        "x": "x" in globals(),
    }
    open("notes.txt", "a").write("more\\n")
    os.mkdir("d/e/new")
    print(json.dumps(seen))
    """
)


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the root sandboxes of this module need root; this test run is not root")


@pytest.fixture(scope="module")
def backend() -> Iterator[NamespacesBackend]:
    _root()
    b = NamespacesBackend()
    try:
        yield b
    finally:
        b.close()


def _open(backend: NamespacesBackend, restore: RestorePoint | None = None) -> CellSandbox:
    box = backend.session_sandbox(REQUEST, session_id=uuid.uuid4().hex[:12], restore=restore)
    box.start()
    return box


def _cell(box: CellSandbox, code: str) -> CellRun:
    run = box.run_cell(code, timeout_s=60, hard_deadline=None)
    assert run.outcome is Outcome.OK, run.stderr.decode(errors="replace")
    return run


def _state_dir(tmp_path: Path) -> Path:
    d = tmp_path / f"state-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    return d


def _digest(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def _saved(backend: NamespacesBackend, tmp_path: Path, *, keep_running: bool) -> RestorePoint:
    box = _open(backend)
    try:
        _cell(box, WRITE_FILES)
        state = _state_dir(tmp_path)
        saved = box.save(state, mode=PauseMode.FILES, keep_running=keep_running)
    finally:
        box.teardown()
    return RestorePoint(state_dir=state, saved=saved)


def test_files_pause_keeps_the_files_not_the_variables(
    backend: NamespacesBackend, tmp_path: Path
) -> None:
    box = _open(backend)
    try:
        _cell(box, WRITE_FILES)
        state = _state_dir(tmp_path)
        saved = box.save(state, mode=PauseMode.FILES, keep_running=False)
        assert box.ended is not None  # stopped; the session tears it down next
    finally:
        box.teardown()
    assert saved.backend == "namespaces" and saved.mode is PauseMode.FILES
    assert saved.detail["left_out"] == "1"  # the link to a host file
    assert sorted(os.listdir(state)) == ["workspace.tar"]
    with tarfile.open(state / "workspace.tar") as tar:
        names = tar.getnames()
        assert "pw" not in names
        host_passwd = Path("/etc/passwd").read_bytes()
        for member in tar.getmembers():
            f = tar.extractfile(member)
            assert f is None or f.read() != host_passwd
    assert sorted(names) == ["d", "d/e", "d/e/deep.bin", "d/rel", "notes.txt", "run.sh"]

    restored = _open(backend, RestorePoint(state_dir=state, saved=saved))
    try:
        seen = json.loads(_cell(restored, CHECK_FILES).stdout)
        assert seen == {
            "notes": "kept\n",
            "deep": True,
            "rel": "e/deep.bin",
            "pw": False,
            "run_mode": "0o755",
            "own": True,
            "x": False,
        }
        assert restored.files() == ["d/e/deep.bin", "notes.txt", "run.sh"]
    finally:
        restored.teardown()


def test_memory_pause_is_refused_and_the_sandbox_goes_on(
    backend: NamespacesBackend, tmp_path: Path
) -> None:
    box = _open(backend)
    try:
        assert box.pause_modes == frozenset({PauseMode.FILES})
        _cell(box, "x = 1")
        state = _state_dir(tmp_path)
        for keep in (True, False):
            with pytest.raises(PauseRefused, match="files only") as refused:
                box.save(state, mode=PauseMode.MEMORY, keep_running=keep)
            assert "mode files" in str(refused.value) and "gvisor" in str(refused.value)
        assert os.listdir(state) == []
        assert _cell(box, "print(x + 1)").stdout == b"2\n"
    finally:
        box.teardown()


def test_snapshot_leaves_the_sandbox_running(backend: NamespacesBackend, tmp_path: Path) -> None:
    box = _open(backend)
    try:
        _cell(box, "import subprocess\nx = 1\np = subprocess.Popen(['sleep', '1000'])")
        state = _state_dir(tmp_path)
        saved = box.save(state, mode=PauseMode.FILES, keep_running=True)
        assert box.ended is None
        run = _cell(box, "open('after.txt', 'w').write('later')\nprint(x, p.poll())")
        assert run.stdout == b"1 None\n"
        assert box.files() == ["after.txt"]
        metrics = box.metrics()
        assert metrics.mem_used_bytes > 0
    finally:
        box.teardown()
    with tarfile.open(state / "workspace.tar") as tar:
        assert tar.getnames() == []
    assert saved.detail["files"] == "0"


def test_one_state_restores_twice_at_once_into_independent_sandboxes(
    backend: NamespacesBackend, tmp_path: Path
) -> None:
    point = _saved(backend, tmp_path, keep_running=True)
    before = _digest(point.state_dir)
    boxes: list[CellSandbox] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            boxes.append(_open(backend, point))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        a, b = boxes
        _cell(a, "open('notes.txt', 'w').write('a changed it')\nimport os; os.remove('run.sh')")
        seen = _cell(b, "import os; print(open('notes.txt').read(), os.path.exists('run.sh'))")
        assert seen.stdout == b"kept\n True\n"
        assert a.sandbox_pid != b.sandbox_pid and a.run_dir != b.run_dir
    finally:
        for box in boxes:
            box.teardown()
    assert _digest(point.state_dir) == before


def _hostile(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> RestorePoint:
    state = _state_dir(tmp_path)
    with tarfile.open(state / "workspace.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    saved = SavedState(
        backend="namespaces",
        mode=PauseMode.FILES,
        detail={"format": "workspace-tar-1", "archive": "workspace.tar"},
    )
    return RestorePoint(state_dir=state, saved=saved)


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def test_a_hostile_state_is_refused_and_writes_nothing(
    backend: NamespacesBackend, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    states = {
        "dotdot": _hostile(tmp_path, (_member("../../../escaped"), b"x")),
        "absolute link": _hostile(
            tmp_path,
            (_member("l", tarfile.SYMTYPE, str(host_dir)), b""),
            (_member("l/owned"), b"x"),
        ),
    }
    for why, point in states.items():
        box = backend.session_sandbox(REQUEST, session_id=uuid.uuid4().hex[:12], restore=point)
        with pytest.raises(ConfigError):
            box.start()
        assert box.ended is not None, why
        assert not box.run_dir.exists(), why
        # Every place the `..` name could have reached from the workspace (run_dir/work).
        for up in box.run_dir.parents[:3]:
            assert not os.path.lexists(up / "escaped"), up
    assert list(host_dir.iterdir()) == []


def test_a_state_of_another_format_is_refused(backend: NamespacesBackend, tmp_path: Path) -> None:
    point = _saved(backend, tmp_path, keep_running=True)
    other = SavedState(backend="namespaces", mode=PauseMode.FILES, detail={"format": "nope"})
    box = backend.session_sandbox(
        REQUEST,
        session_id=uuid.uuid4().hex[:12],
        restore=RestorePoint(state_dir=point.state_dir, saved=other),
    )
    with pytest.raises(ConfigError, match="format"):
        box.start()


def test_a_save_under_a_writer_is_never_torn(backend: NamespacesBackend, tmp_path: Path) -> None:
    box = _open(backend)
    try:
        assert isinstance(box, SessionSandbox)
        if box.cgroup is None or not box.cgroup.can_freeze:
            pytest.skip("this host gives the session no freezer: the save's race is documented")
        writer = textwrap.dedent(
            """
            import subprocess, sys
            code = '''
            import os
            n = 0
            while True:
                n += 1
                with open("f.tmp", "w") as f:
                    f.write(str(n % 10) * 4096)
                os.replace("f.tmp", "f")
            '''
            w = subprocess.Popen([sys.executable, "-c", code])
            """
        )
        _cell(box, writer)
        _cell(box, "import os, time\nwhile not os.path.exists('f'): time.sleep(0.01)")
        for _ in range(20):
            state = _state_dir(tmp_path)
            box.save(state, mode=PauseMode.FILES, keep_running=True)
            with tarfile.open(state / "workspace.tar") as tar:
                f = tar.extractfile("f")
                assert f is not None
                data = f.read()
            assert len(data) == 4096 and len(set(data)) == 1
        assert _cell(box, "print(w.poll())").stdout == b"None\n"
    finally:
        box.teardown()


def test_metrics_read_the_session(backend: NamespacesBackend) -> None:
    box = _open(backend)
    try:
        first = box.metrics()
        assert first.cpu_count >= 1 and 0.0 <= first.cpu_used_pct <= 100.0
        assert first.mem_total_bytes == REQUEST.effective_limits.memory_bytes
        assert 0 < first.mem_used_bytes <= first.mem_total_bytes
        assert first.disk_total_bytes == 16 * MiB
        _cell(
            box,
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
            "open('blob', 'wb').write(b'x' * (2 << 20))",
        )
        second = box.metrics()
        assert second.cpu_used_pct > 0.0
        assert second.disk_used_bytes >= 2 << 20 > first.disk_used_bytes
    finally:
        box.teardown()
    with pytest.raises(InfraError, match="ended"):
        box.metrics()


_AS_USER = textwrap.dedent(
    """
    import json, os, sys, tempfile, uuid
    from pathlib import Path
    from sandcell.backends.cell.state import PauseMode, PauseRefused, RestorePoint
    from sandcell.backends.namespaces import NamespacesBackend
    from sandcell.spec import IsolationMode, Limits, MiB, RunRequest

    write, check = sys.argv[2], sys.argv[3]
    request = RunRequest(code="", mode=IsolationMode(sys.argv[1]),
                         limits=Limits(wall_time_s=60.0, workspace_bytes=16 * MiB))
    backend = NamespacesBackend()
    out = {}

    def cell(box, code):
        r = box.run_cell(code, timeout_s=60, hard_deadline=None)
        assert r.outcome.value == "ok", r.stderr.decode(errors="replace")
        return r.stdout.decode()

    try:
        state = Path(tempfile.mkdtemp())
        box = backend.session_sandbox(request, session_id=uuid.uuid4().hex[:12])
        box.start()
        try:
            cell(box, write)
            try:
                box.save(state, mode=PauseMode.MEMORY, keep_running=True)
            except PauseRefused as exc:
                out["memory"] = str(exc)
            out["metrics"] = box.metrics().to_dict()
            snap = Path(tempfile.mkdtemp())
            box.save(snap, mode=PauseMode.FILES, keep_running=True)
            out["after_snapshot"] = cell(box, "print(x)")
            saved = box.save(state, mode=PauseMode.FILES, keep_running=False)
            out["ended"] = box.ended
        finally:
            box.teardown()
        out["archive"] = sorted(os.listdir(state))
        again = backend.session_sandbox(request, session_id=uuid.uuid4().hex[:12],
                                        restore=RestorePoint(state_dir=state, saved=saved))
        again.start()
        try:
            out["seen"] = json.loads(cell(again, check))
        finally:
            again.teardown()
    finally:
        backend.close()
    print(json.dumps(out))
    """
).strip()


def test_files_pause_as_the_unprivileged_user(unpriv: UnprivEnv) -> None:
    cmd = [
        "runuser", "-u", unpriv.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={unpriv.home}", f"PYTHONPATH={unpriv.pythonpath}",
        f"SANDCELL_HOME={unpriv.home}", f"SANDCELL_RUNS={unpriv.runs}",
        *([f"PYTHONPYCACHEPREFIX={unpriv.pycache}"] if unpriv.pycache is not None else []),
        unpriv.python, "-c", _AS_USER, unpriv.mode.value, WRITE_FILES, CHECK_FILES,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = json.loads(proc.stdout)
    assert "files only" in out["memory"]
    assert out["after_snapshot"] == "41\n"
    assert out["ended"] is not None and out["archive"] == ["workspace.tar"]
    metrics = out["metrics"]
    assert metrics["mem_used_bytes"] > 0 and metrics["disk_total_bytes"] == 16 * MiB
    assert out["seen"] == {
        "notes": "kept\n",
        "deep": True,
        "rel": "e/deep.bin",
        "pw": False,
        "run_mode": "0o755",
        "own": True,
        "x": False,
    }
