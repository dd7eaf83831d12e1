"""Pause, fork and snapshot of a microVM session sandbox (issue 23), for real, at the cell
contract's level (``backend.session_sandbox`` with and without a ``RestorePoint``).

Memory: a cell sets a variable and starts a process; the VM saves itself while it keeps running
(a fork), the parent goes on, two copies restored at once from the one state have the variable,
the process, fresh entropy each and the host's wall clock; one copy is saved again and stopped
(a pause), and comes back once more. A state is refused before any VM starts where its QEMU
facts or limits differ. Files: only the workspace's files come back, never a link's target.

Few VMs (TCG boots take seconds each): one saved state serves several checks. Skips with the
reason where the host has no QEMU or no built guest (``scripts/install-vm``, ``sandcell vm
build``); an image built before pause existed fails the restore with a message naming the build.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import backend_unavailable

from sandcell.backends.cell.state import PauseMode, RestorePoint, SavedState
from sandcell.backends.microvm import MicroVMBackend, probe
from sandcell.backends.microvm.session import VMSessionSandbox
from sandcell.errors import ConfigError, IsolationUnavailable
from sandcell.spec import Limits, Outcome, RunRequest

status = probe()
REQUEST = RunRequest(code="")


@pytest.fixture(scope="module")
def backend() -> MicroVMBackend:
    if not status.usable:
        backend_unavailable("microvm", status.detail)
    try:
        return MicroVMBackend()
    except IsolationUnavailable as exc:
        backend_unavailable("microvm", str(exc))
        raise


@pytest.fixture
def states() -> Iterator[Path]:
    # Under /var/tmp: a state must outlive a reboot, so not a tmpfs.
    root = Path(tempfile.mkdtemp(prefix="sandcell-vm-states-", dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _state_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    return d


def _open(
    backend: MicroVMBackend,
    restore: RestorePoint | None = None,
    request: RunRequest = REQUEST,
) -> VMSessionSandbox:
    box = backend.session_sandbox(request, session_id=uuid.uuid4().hex, restore=restore)
    assert isinstance(box, VMSessionSandbox)
    box.start()
    return box


def _cell(box: VMSessionSandbox, code: str) -> str:
    run = box.run_cell(code, timeout_s=120, hard_deadline=None)
    assert run.outcome is Outcome.OK, (run.reason, run.stderr[-2000:])
    return run.stdout.decode()


PROBE = (
    "import json, os, time, uuid\n"
    "print(json.dumps({'x': x + 1, 'alive': p.poll() is None, 'pid': p.pid,\n"
    "    'urandom': os.urandom(16).hex(), 'uuid': str(uuid.uuid4()), 'time': time.time(),\n"
    "    'file': open('/sandbox/kept.txt').read()}))\n"
)


def _probe(box: VMSessionSandbox) -> dict[str, object]:
    doc = json.loads(_cell(box, PROBE).strip().splitlines()[-1])
    assert isinstance(doc, dict)
    return doc


def test_memory_fork_pause_and_restore(backend: MicroVMBackend, states: Path) -> None:
    boxes: list[VMSessionSandbox] = []
    try:
        parent = _open(backend)
        boxes.append(parent)
        assert parent.pause_modes == {PauseMode.MEMORY, PauseMode.FILES}
        _cell(
            parent,
            "import subprocess\nx = 41\np = subprocess.Popen(['sleep', '1000'])\n"
            "open('/sandbox/kept.txt', 'w').write('kept')\n",
        )
        fork_dir = _state_dir(states, "fork")
        saved = parent.save(fork_dir, mode=PauseMode.MEMORY, keep_running=True)
        assert saved.backend == "microvm" and saved.mode is PauseMode.MEMORY
        for fact in ("qemu_version", "identity", "machine", "cpu", "memory_mib", "image_sha256"):
            assert saved.detail.get(fact), fact
        assert sorted(os.listdir(fork_dir)) == ["ram", "state"]
        ram = os.stat(fork_dir / "ram")
        assert ram.st_blocks * 512 < ram.st_size, "the RAM file should be sparse"

        # The parent goes on where it was; the copies do not see what it does next.
        assert _cell(parent, "x = 1000\nprint(p.poll())").strip() == "None"
        before_files = {p.name: p.stat().st_mtime_ns for p in fork_dir.iterdir()}

        point = RestorePoint(state_dir=fork_dir, saved=SavedState.from_dict(saved.to_dict()))
        copies: list[VMSessionSandbox | BaseException] = []
        lock = threading.Lock()

        def restore_one() -> None:
            try:
                got: VMSessionSandbox | BaseException = _open(backend, point)
            except BaseException as exc:
                got = exc
            with lock:
                copies.append(got)

        host_before = time.time()
        threads = [threading.Thread(target=restore_one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in copies:
            if isinstance(c, VMSessionSandbox):
                boxes.append(c)
        for c in copies:
            if isinstance(c, BaseException):
                raise c
        one, two = (c for c in copies if isinstance(c, VMSessionSandbox))
        a, b = _probe(one), _probe(two)
        host_after = time.time()
        for doc in (a, b):
            assert doc["x"] == 42 and doc["alive"] is True and doc["file"] == "kept"
            # The clock was set from the host's after the restore, not left at the save.
            assert isinstance(doc["time"], float)
            assert host_before - 0.05 <= doc["time"] <= host_after + 0.05
        assert a["pid"] == b["pid"]
        assert a["urandom"] != b["urandom"] and a["uuid"] != b["uuid"]
        assert _cell(parent, "print(x)").strip() == "1000"
        # A restore never writes into the state directory.
        assert {p.name: p.stat().st_mtime_ns for p in fork_dir.iterdir()} == before_files

        m = one.metrics()
        assert m.cpu_count == 1 and 0 <= m.cpu_used_pct <= 100
        assert 0 < m.mem_used_bytes <= m.mem_total_bytes == REQUEST.effective_limits.memory_bytes
        assert 0 < m.disk_used_bytes <= m.disk_total_bytes

        # A pause of a copy: saved, stopped, torn down, and back once more.
        pause_dir = _state_dir(states, "pause")
        paused = one.save(pause_dir, mode=PauseMode.MEMORY, keep_running=False)
        one.teardown()
        back = _open(backend, RestorePoint(state_dir=pause_dir, saved=paused))
        boxes.append(back)
        doc = _probe(back)
        assert doc["x"] == 42 and doc["alive"] is True and doc["file"] == "kept"

        # Refused before a VM starts: QEMU does not check these itself.
        for fact, value in (("qemu_version", "0.0.1"), ("memory_mib", "999")):
            wrong = dataclasses.replace(paused, detail={**paused.detail, fact: value})
            with pytest.raises(ConfigError):
                _open(backend, RestorePoint(state_dir=pause_dir, saved=wrong))
        other = RunRequest(code="", limits=Limits(memory_bytes=256 << 20))
        with pytest.raises(ConfigError, match="limits"):
            _open(backend, RestorePoint(state_dir=pause_dir, saved=paused), request=other)
    finally:
        for box in boxes:
            box.teardown()


def test_files_mode_keeps_files_only(backend: MicroVMBackend, states: Path) -> None:
    box = _open(backend)
    try:
        assert (
            _cell(
                box,
                "import os\ny = 1\nos.makedirs('/sandbox/d/e')\n"
                "open('/sandbox/d/e/deep.txt', 'w').write('deep')\n"
                "open('/sandbox/top.bin', 'wb').write(bytes(range(256)) * 1000)\n"
                "os.symlink('/etc/passwd', '/sandbox/link')\n"
                "print('ok')\n",
            ).strip()
            == "ok"
        )
        files_dir = _state_dir(states, "files")
        saved = box.save(files_dir, mode=PauseMode.FILES, keep_running=False)
    finally:
        box.teardown()
    assert saved.mode is PauseMode.FILES
    kept = files_dir / "files"
    assert (kept / "d" / "e" / "deep.txt").read_text() == "deep"
    assert (kept / "top.bin").read_bytes() == bytes(range(256)) * 1000
    assert not os.path.lexists(kept / "link")
    back = _open(backend, RestorePoint(state_dir=files_dir, saved=saved))
    try:
        out = _cell(
            back,
            "import os\nprint('y' in globals(), open('/sandbox/d/e/deep.txt').read(),\n"
            "      len(open('/sandbox/top.bin', 'rb').read()), os.path.lexists('/sandbox/link'),\n"
            "      os.stat('/sandbox/top.bin').st_uid == os.getuid())\n"
            "open('/sandbox/top.bin', 'ab').write(b'more')\n",
        )
        assert out.split() == ["False", "deep", "256000", "False", "True"]
    finally:
        back.teardown()
