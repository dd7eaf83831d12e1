"""gVisor session sandboxes that last: save (memory or files) and restore, at the CellSandbox level.

Real runsc sandboxes: ``runsc checkpoint`` of a live session, ``runsc restore`` into new
sandboxes (one after a pause, two at once from one image, the parent of a fork going on), and the
files-only mode. The session level (states under the home, records) is tested with the sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import UnprivEnv

from sandcell.backends.cell.state import PauseMode, RestorePoint, SavedState
from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.spec import Limits, MiB, Outcome, RunRequest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these tests run as root")

_REQUEST = RunRequest(code="", limits=Limits(wall_time_s=60, memory_bytes=384 * MiB))
_SETUP = (
    "x = 41\n"
    "import os, subprocess\n"
    "p = subprocess.Popen(['sleep', '1000'])\n"
    "os.mkdir('d')\n"
    "open('d/kept.txt', 'w').write('kept')\n"
    "os.symlink('kept.txt', 'd/near')\n"
    "os.symlink('/etc/passwd', 'd/far')\n"
    "os.mkfifo('pipe')\n"
    "open('/tmp/private.txt', 'w').write('sentry tmpfs')\n"
    "print('set up')\n"
)


@pytest.fixture(scope="module")
def gv() -> Iterator[object]:
    from sandcell.backends.gvisor import GVisorBackend

    try:
        b = GVisorBackend()
    except IsolationUnavailable as exc:
        pytest.skip(f"gVisor is not usable here: {exc}")
    yield b
    b.close()


_COUNT = iter(range(1_000_000))


def _open(
    gv: object, restore: RestorePoint | None = None, request: RunRequest = _REQUEST
) -> object:
    box = gv.session_sandbox(  # type: ignore[attr-defined]
        request, session_id=f"pause{next(_COUNT)}", restore=restore
    )
    try:
        box.start()
    except BaseException:
        box.teardown()
        raise
    return box


def _cell(box: object, code: str) -> str:
    run = box.run_cell(code, timeout_s=60, hard_deadline=None)  # type: ignore[attr-defined]
    assert run.outcome is Outcome.OK, (run.reason, run.stderr.decode()[-2000:])
    return str(run.stdout.decode())


def _state_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir(mode=0o700)
    return d


def _fingerprint(state_dir: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``state_dir``: (size, mtime, sha256), to show a restore wrote nothing."""
    out: dict[str, tuple[int, int, str]] = {}
    for dirpath, _dirs, names in os.walk(state_dir):
        for name in names:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(state_dir))] = (
                st.st_size,
                st.st_mtime_ns,
                hashlib.sha256(p.read_bytes()).hexdigest(),
            )
    return out


def _save(box: object, state_dir: Path, mode: PauseMode, *, keep_running: bool) -> RestorePoint:
    saved: SavedState = box.save(  # type: ignore[attr-defined]
        state_dir, mode=mode, keep_running=keep_running
    )
    assert saved.backend == "gvisor" and saved.mode is mode
    # What the session layer does with it: kept as JSON in the manifest, read back.
    saved = SavedState.from_dict(json.loads(json.dumps(saved.to_dict())))
    return RestorePoint(state_dir=state_dir, saved=saved)


def test_pause_modes(gv: object) -> None:
    box = _open(gv)
    try:
        assert box.pause_modes == {PauseMode.MEMORY, PauseMode.FILES}  # type: ignore[attr-defined]
    finally:
        box.teardown()  # type: ignore[attr-defined]


def test_memory_pause_brings_back_variables_processes_and_files(gv: object, tmp_path: Path) -> None:
    box = _open(gv)
    try:
        assert _cell(box, _SETUP) == "set up\n"
        before = _cell(box, "print(os.getpid(), p.pid)")
        point = _save(box, _state_dir(tmp_path, "paused"), PauseMode.MEMORY, keep_running=False)
        assert box.ended is not None  # type: ignore[attr-defined]
        assert box.sb.proc.poll() is not None  # type: ignore[attr-defined]
    finally:
        box.teardown()  # type: ignore[attr-defined]
    assert (point.state_dir / "image" / "checkpoint.img").stat().st_size > 0
    back = _open(gv, point)
    try:
        # The channel is new and works: a cell's output arrives, its reply too.
        assert _cell(back, "print(x + 1, p.poll())") == "42 None\n"
        assert _cell(back, "print(os.getpid(), p.pid)") == before
        files = _cell(
            back,
            "print(open('d/kept.txt').read(), os.readlink('d/near'), "
            "os.path.lexists('d/far'), open('/tmp/private.txt').read())",
        )
        # A link out of the workspace is not kept (host/workspace_archive.py); gVisor's own
        # /tmp is in the image.
        assert files == "kept kept.txt False sentry tmpfs\n"
        owner = _cell(back, "print(os.stat('d/kept.txt').st_uid, os.getuid())")
        uid, me = owner.split()
        assert uid == me, owner
        # The restored kernel takes new cells as before, and the process it kept is its child.
        assert _cell(back, "p.kill(); print(p.wait())") == "-9\n"
    finally:
        back.teardown()  # type: ignore[attr-defined]


def test_same_confinement_after_restore(gv: object, tmp_path: Path) -> None:
    probe = (
        "import ctypes, resource, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        # PR_GET_SECCOMP (2: a filter), PR_GET_NO_NEW_PRIVS: gVisor's status file lacks them.
        "print(libc.prctl(21, 0, 0, 0, 0), libc.prctl(39, 0, 0, 0, 0), os.getuid(), "
        "resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_NPROC), "
        "sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n"
        # The seccomp filter's refusal of a netlink socket, as before the save.
        "try:\n    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)\nexcept OSError as e:\n"
        "    print(e.errno)\nelse:\n    print('netlink allowed')"
    )
    box = _open(gv)
    try:
        _cell(box, "import os")
        fresh = _cell(box, probe)
        point = _save(box, _state_dir(tmp_path, "s"), PauseMode.MEMORY, keep_running=False)
    finally:
        box.teardown()  # type: ignore[attr-defined]
    assert fresh.startswith("2 1 ") and fresh.endswith("['lo']\n1\n"), fresh
    back = _open(gv, point)
    try:
        assert _cell(back, probe) == fresh
        sb = back.sb  # type: ignore[attr-defined]
        assert sb.cgroup is not None
        procs = [
            int(x)
            for d in sb.cgroup.dirs.values()
            for x in (d / "cgroup.procs").read_text().split()
        ]
        assert sb.proc.pid in procs, "the restored sandbox runs outside its cgroup"
        if sb.cgroup.host.version == 1:
            limit = int((sb.cgroup.dirs["memory"] / "memory.limit_in_bytes").read_text())
        else:
            limit = int((sb.cgroup.dirs["unified"] / "memory.max").read_text())
        assert limit == 384 * MiB
    finally:
        back.teardown()  # type: ignore[attr-defined]
    # Never into another sandbox: a memory state comes back only under the limits it had.
    other = RunRequest(code="", limits=Limits(wall_time_s=60, memory_bytes=512 * MiB))
    with pytest.raises(ConfigError, match="differs from the one saved"):
        _open(gv, point, other)


def test_fork_leaves_parent_running_and_copies_independent(gv: object, tmp_path: Path) -> None:
    box = _open(gv)
    copies: list[object] = []
    try:
        assert _cell(box, _SETUP) == "set up\n"
        point = _save(box, _state_dir(tmp_path, "fork"), PauseMode.MEMORY, keep_running=True)
        assert box.ended is None  # type: ignore[attr-defined]
        # The parent goes on, on its new channel: same variables, same process.
        assert _cell(box, "x += 100; print(x, p.poll())") == "141 None\n"
        image = _fingerprint(point.state_dir)
        errors: list[BaseException] = []

        def restore() -> None:
            try:
                copies.append(_open(gv, point))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=restore) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(copies) == 2
        assert _fingerprint(point.state_dir) == image, "a restore changed the state directory"
        # Each copy has the state of the save, not the parent's later change, nor the other's.
        assert _cell(copies[0], "x -= 1; print(x, p.poll())") == "40 None\n"
        assert _cell(copies[1], "print(x)") == "41\n"
        assert _cell(box, "print(x)") == "141\n"
        # Fresh kernel entropy in each copy.
        draw = "import uuid; print(os.urandom(16).hex(), uuid.uuid4())"
        draws = {_cell(c, draw) for c in copies}
        assert len(draws) == 2, draws
        # Files are each copy's own.
        _cell(copies[0], "open('d/kept.txt', 'w').write('changed')")
        assert _cell(copies[1], "print(open('d/kept.txt').read())") == "kept\n"
        assert _cell(box, "print(open('d/kept.txt').read())") == "kept\n"
    finally:
        for c in copies:
            c.teardown()  # type: ignore[attr-defined]
        box.teardown()  # type: ignore[attr-defined]


def test_restored_clock_is_the_hosts(gv: object, tmp_path: Path) -> None:
    box = _open(gv)
    try:
        _cell(box, "import time")
        point = _save(box, _state_dir(tmp_path, "c"), PauseMode.MEMORY, keep_running=False)
        saved_at = time.time()
    finally:
        box.teardown()  # type: ignore[attr-defined]
    # The event waited for: the host's clock has moved well past the save, so a clock
    # restored as it was saved would show.
    while time.time() < saved_at + 3:
        time.sleep(0.1)
    back = _open(gv, point)
    try:
        before = time.time()
        inside = float(_cell(back, "print(repr(time.time()))"))
        after = time.time()
        assert before - 1 <= inside <= after + 1, (before, inside, after)
    finally:
        back.teardown()  # type: ignore[attr-defined]


def test_files_mode_keeps_files_not_variables(gv: object, tmp_path: Path) -> None:
    box = _open(gv)
    try:
        assert _cell(box, _SETUP) == "set up\n"
        point = _save(box, _state_dir(tmp_path, "f"), PauseMode.FILES, keep_running=False)
    finally:
        box.teardown()  # type: ignore[attr-defined]
    assert not (point.state_dir / "image").exists()
    back = _open(gv, point)
    try:
        assert _cell(back, "print('x' in globals())") == "False\n"
        got = _cell(
            back,
            "import os\nprint(open('d/kept.txt').read(), os.readlink('d/near'), "
            "os.path.lexists('d/far'), os.path.exists('/tmp/private.txt'), "
            "os.path.exists('pipe'))",
        )
        # Links out of the workspace and fifos are left out; gVisor's /tmp is not the workspace.
        assert got == "kept kept.txt False False False\n"
        assert _cell(back, "open('d/new.txt', 'w').write('w'); print('ok')") == "ok\n"
    finally:
        back.teardown()  # type: ignore[attr-defined]


def test_files_mode_of_a_live_session_keeps_it_running(gv: object, tmp_path: Path) -> None:
    box = _open(gv)
    try:
        _cell(box, "x = 1; open('a.txt', 'w').write('a')")
        point = _save(box, _state_dir(tmp_path, "live"), PauseMode.FILES, keep_running=True)
        assert _cell(box, "print(x, open('a.txt').read())") == "1 a\n"
        assert point.saved.detail["workspace_files"] == "1"
    finally:
        box.teardown()  # type: ignore[attr-defined]


def test_metrics(gv: object) -> None:
    box = _open(gv)
    try:
        first = box.metrics()  # type: ignore[attr-defined]
        _cell(box, "data = bytearray(64 << 20); open('f.bin', 'wb').write(bytes(1 << 20))")
        second = box.metrics()  # type: ignore[attr-defined]
        assert second.cpu_count == (os.cpu_count() or 1)
        assert 0 <= first.cpu_used_pct <= 100 and 0 <= second.cpu_used_pct <= 100
        assert second.mem_total_bytes == 384 * MiB
        assert first.mem_used_bytes < second.mem_used_bytes
        assert second.mem_used_bytes >= 64 << 20
        assert second.disk_total_bytes == _REQUEST.effective_limits.workspace_bytes
        assert second.disk_used_bytes >= 1 << 20
        assert second.timestamp >= first.timestamp
    finally:
        box.teardown()  # type: ignore[attr-defined]


_AS_USER = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    from sandcell.backends.cell.state import PauseMode, PauseRefused, RestorePoint
    from sandcell.backends.gvisor import GVisorBackend
    from sandcell.errors import IsolationUnavailable
    from sandcell.spec import IsolationMode, Limits, RunRequest

    request = RunRequest(code="", mode=IsolationMode.RLIMITS, limits=Limits(wall_time_s=60))
    try:
        backend = GVisorBackend()
    except IsolationUnavailable as exc:
        print(json.dumps({"unavailable": str(exc)}))
        raise SystemExit(0)
    out = {}

    def cell(box, code):
        r = box.run_cell(code, timeout_s=60, hard_deadline=None)
        assert r.outcome.value == "ok", r.stderr.decode(errors="replace")
        return r.stdout.decode()

    try:
        state = Path(tempfile.mkdtemp())
        box = backend.session_sandbox(request, session_id="rootless-save")
        box.start()
        try:
            cell(box, "import os; x = 1; os.mkdir('d'); open('d/f', 'w').write('kept')")
            out["modes"] = sorted(m.value for m in box.pause_modes)
            try:
                box.save(state, mode=PauseMode.MEMORY, keep_running=True)
            except PauseRefused as exc:
                out["memory"] = str(exc)
            out["metrics"] = box.metrics().to_dict()
            saved = box.save(state, mode=PauseMode.FILES, keep_running=False)
        finally:
            box.teardown()
        again = backend.session_sandbox(request, session_id="rootless-back",
                                        restore=RestorePoint(state_dir=state, saved=saved))
        again.start()
        try:
            out["seen"] = cell(again, "print(open('d/f').read(), 'x' in globals())")
            out["write"] = cell(again, "open('d/g', 'w').write('w'); print('ok')")
        finally:
            again.teardown()
    finally:
        backend.close()
    print(json.dumps(out))
    """
).strip()


def test_files_pause_as_an_ordinary_user(unpriv: UnprivEnv) -> None:
    """Rootless gVisor: memory refused (the workspace is the helper's), files kept and filled
    through the helper's view before the first cell."""
    cmd = [
        "runuser", "-u", unpriv.user, "--", "env", "-i",
        "PATH=/usr/bin:/bin", f"HOME={unpriv.home}", f"PYTHONPATH={unpriv.pythonpath}",
        f"SANDCELL_HOME={unpriv.home}", f"SANDCELL_RUNS={unpriv.runs}",
        *([f"PYTHONPYCACHEPREFIX={unpriv.pycache}"] if unpriv.pycache is not None else []),
        unpriv.python, "-c", _AS_USER,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    out = json.loads(proc.stdout)
    if "unavailable" in out:
        pytest.skip(f"rootless gVisor is not usable here: {out['unavailable']}")
    assert out["modes"] == ["files"]
    assert "rootless" in out["memory"], out["memory"]
    assert out["metrics"]["disk_total_bytes"] > 0
    assert out["seen"] == "kept False\n"
    assert out["write"] == "ok\n"
