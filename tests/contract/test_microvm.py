"""The microVM backend, for real: a guest kernel that is not the host's, outcomes, inputs and
exports, fresh entropy in every restored VM, tampered files refused, nothing left behind.

Most tests share one pooled backend (one snapshot, restored clones), as a CI host with two cores
can afford; a few need a cold boot. They skip with the reason where the host has no QEMU or no
built guest (``scripts/install-vm`` then ``sandcell vm build``).
"""

from __future__ import annotations

import json
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell import Executor, Limits, RunRequest, input_from_path
from sandcell.backends.microvm import MicroVMBackend, layout, machine, probe, sweep
from sandcell.backends.warm import WarmConfig
from sandcell.errors import IsolationUnavailable
from sandcell.spec import Outcome

status = probe()
pytestmark = pytest.mark.skipif(not status.usable, reason=f"microVM backend: {status.detail}")


def _qemus_of(path: Path) -> list[int]:
    needle = str(path).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmdline and needle in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executor]:
    home = tmp_path_factory.mktemp("microvm-home")
    backend = MicroVMBackend(warm=WarmConfig(mode="pool", pool_size=2))
    with Executor(home=home, profile="unchecked", backend=backend) as ex:
        # After `sandcell vm build` the snapshot is taken first: on a busy host with two cores
        # that can take longer than a run waits for it (the run would then start cold).
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            stats = backend.warm_stats()
            assert stats is not None and stats.pool is not None
            if stats.pool.ready or stats.template_state.get("error"):
                break
            time.sleep(0.2)
        yield ex


def test_the_guest_kernel_is_not_the_hosts(pooled: Executor) -> None:
    r = pooled.run(RunRequest(code="import os; print(os.uname().release); print(6*7)"))
    assert r.outcome is Outcome.OK, r.reason
    release, answer = r.stdout.split()
    assert answer == "42"
    assert release != platform.release()
    assert r.start.mode == "pool"
    assert r.enforcement is not None and r.enforcement.backend == "microvm"
    versions = pooled.backend.versions()
    assert len(versions["guest_image_sha256"]) == 64 and "QEMU" in versions["qemu"]
    entry = pooled.audit.get(r.run_id)
    assert entry is not None
    backend = entry.record["backend"]
    assert isinstance(backend, dict)
    assert backend["guest_kernel_sha256"] == versions["guest_kernel_sha256"]


def test_two_pooled_runs_get_fresh_entropy_and_identity(pooled: Executor) -> None:
    code = (
        "import os, random, socket, time, numpy\n"
        "print(os.urandom(16).hex(), random.random(), numpy.random.rand(), socket.gethostname(),"
        " round(time.time()))\n"
    )
    first = pooled.run(RunRequest(code=code))
    second = pooled.run(RunRequest(code=code))
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK, (
        first.reason,
        second.reason,
    )
    a, b = first.stdout.split(), second.stdout.split()
    for i, what in enumerate(("os.urandom", "random", "numpy.random", "hostname")):
        assert a[i] != b[i], f"{what} repeated across restored VMs: {a[i]}"
    # The wall clock was set from the host, not left at the snapshot's time.
    assert abs(int(a[4]) - time.time()) < 120


@pytest.mark.parametrize(
    ("code", "limits", "outcome"),
    [
        ("import sys; print('x'); sys.exit(3)", None, Outcome.ERROR),
        ("while True: pass", Limits(wall_time_s=2), Outcome.TIMEOUT),
        ("print('y' * 100000)", Limits(stdout_bytes=1000), Outcome.OUTPUT_LIMIT),
        ("x = bytearray(400 * 2**20)", Limits(memory_bytes=128 * 2**20), Outcome.MEMORY_LIMIT),
        ("import os\nwhile True: os.fork()", Limits(max_pids=16, wall_time_s=5), None),
    ],
)
def test_outcomes(
    pooled: Executor, code: str, limits: Limits | None, outcome: Outcome | None
) -> None:
    r = pooled.run(RunRequest(code=code, limits=limits))
    if outcome is None:
        # A fork bomb is contained: it ends (error or timeout), and the next run is unaffected.
        assert r.outcome in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.KILLED), r.reason
        assert pooled.run(RunRequest(code="print(1)")).stdout == "1\n"
    else:
        assert r.outcome is outcome, r.reason
    if outcome is Outcome.OUTPUT_LIMIT:
        assert r.stdout_truncated and len(r.stdout) <= 1000


def test_inputs_are_read_only_and_exports_pass_the_host_checks(
    pooled: Executor, tmp_path: Path
) -> None:
    data = tmp_path / "sales.csv"
    data.write_text("day,n\n1,3\n2,5\n")
    code = (
        "import os, pandas as pd\n"
        "df = pd.read_csv('sales.csv')\n"
        "os.makedirs('out')\n"
        "df.to_csv('out/total.csv')\n"
        "os.symlink('/etc/passwd', 'out/link.csv')\n"
        "try:\n    open('/inputs/sales.csv', 'a')\nexcept OSError as e:\n    print('ro', e.errno)\n"
        "print(df.n.sum())\n"
    )
    r = pooled.run(RunRequest(code=code, inputs=(input_from_path(data),), exports=("out/*.csv",)))
    assert r.outcome is Outcome.OK, r.reason + r.stderr
    assert r.stdout.split() == ["ro", "30", "8"]
    assert [a.path for a in r.artifacts] == ["out/total.csv"]
    assert pooled.store.path_for(r.artifacts[0].sha256).read_text().startswith(",day,n")
    assert [x.path for x in r.rejected_exports] == ["out/link.csv"]


def test_display_outputs_come_back(pooled: Executor) -> None:
    r = pooled.run(
        RunRequest(code="import pandas as pd\npd.DataFrame({'a': [1, 2]})", display=True)
    )
    assert r.outcome is Outcome.OK, r.reason + r.stderr
    assert [o.kind for o in r.outputs] == ["table"]


def test_the_program_cannot_crash_the_guest_kernel_on_purpose(pooled: Executor) -> None:
    r = pooled.run(RunRequest(code="open('/proc/sysrq-trigger', 'w').write('c')"))
    assert r.outcome is Outcome.ERROR
    assert "Permission denied" in r.stderr or "Read-only" in r.stderr


def test_a_cold_run_boots_its_own_kernel(tmp_path: Path) -> None:
    backend = MicroVMBackend()
    with Executor(home=tmp_path, profile="unchecked", backend=backend) as ex:
        r = ex.run(RunRequest(code="uname -r; id -u", language="bash"))
    assert r.outcome is Outcome.OK, r.reason
    release, uid = r.stdout.split()
    assert release != platform.release() and uid == "1000"
    assert r.start.mode == "cold"


def test_a_guest_that_never_becomes_ready_is_an_infra_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "READY_TIMEOUT_S", 0.5)
    backend = MicroVMBackend()
    with Executor(home=tmp_path, profile="unchecked", backend=backend) as ex:
        t0 = time.monotonic()
        r = ex.run(RunRequest(code="print(1)"))
    assert r.outcome is Outcome.INFRA_ERROR
    assert "never became ready" in r.reason
    assert time.monotonic() - t0 < 60
    # The VM of that run (its directory is named after the run) is gone.
    assert not _qemus_of(layout.runs_root() / layout.owner_tag() / r.run_id[:12])


def test_a_tampered_image_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = layout.vm_dir()
    fake = tmp_path / "vm"
    shutil.copytree(real / "kernel", fake / "kernel")
    (fake / "image").mkdir()
    for name in ("manifest.json", "initrd.cpio"):
        shutil.copy(real / "image" / name, fake / "image" / name)
    (fake / "image" / "root.ext4").write_bytes(b"not the image the manifest names")
    monkeypatch.setenv("SANDCELL_VM_DIR", str(fake))
    with pytest.raises(IsolationUnavailable, match="tampered") as info:
        MicroVMBackend()
    assert "sandcell vm build" in info.value.fix
    assert not probe().usable


def test_a_killed_supervisor_leaves_nothing_after_the_next_sweep(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from sandcell.backends.microvm import MicroVMBackend, machine\n"
        "b = MicroVMBackend()\n"
        "vm = machine.boot(b.guest, memory_mib=320, name='orphan')\n"
        "print(vm.run_dir, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().strip())
        assert run_dir.is_dir() and _qemus_of(run_dir)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    removed = sweep()
    assert str(run_dir.parent) in removed
    deadline = time.monotonic() + 10
    while _qemus_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _qemus_of(run_dir)
    assert not run_dir.exists()


def test_nothing_is_left_after_close(tmp_path: Path) -> None:
    owner = layout.runs_root() / layout.owner_tag()
    before = set(owner.iterdir()) if owner.is_dir() else set()
    backend = MicroVMBackend(warm=WarmConfig(mode="pool", pool_size=1))
    with Executor(home=tmp_path, profile="unchecked", backend=backend) as ex:
        assert ex.run(RunRequest(code="print(2)")).stdout == "2\n"
        during = set(owner.iterdir()) - before
        assert during, "the pool keeps a restored VM ready"
    after = (set(owner.iterdir()) if owner.is_dir() else set()) - before
    assert after == set()
    assert not [p for d in during for p in _qemus_of(d)]
    # Snapshots being taken by other processes of this user (named after their owner) are theirs.
    left = [p.name for p in layout.snapshots_root().iterdir() if layout.owner_tag() in p.name]
    assert left == []
    # What stays is the snapshot shared with this user's later processes, by design (and those
    # of other VM directories' images, which are theirs).
    # (Only the shared ones: another process's snapshot being taken has no meta.json yet.)
    shared = [p for p in layout.snapshots_root().iterdir() if p.name.startswith("cache-")]
    kept = [json.loads((p / "meta.json").read_text()) for p in shared]
    image_arg = f"id=root,file={backend.guest.files.image},"
    ours = [k for k in kept if any(a.startswith(image_arg) for a in k["identity"])]
    assert ours and all(k["image_sha256"] == backend.versions()["guest_image_sha256"] for k in ours)
