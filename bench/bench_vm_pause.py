"""Pause, resume and fork of a microVM session (issue 23's targets), measured on this host.

    .venv/bin/python bench/bench_vm_pause.py [--runtime analysis] [--rounds 3] [--forks 4]

A session of a runtime with pandas (``analysis``) at the cell contract's level:

- ``cold``: a new session VM (cold boot) until ``import pandas`` returned;
- ``save``: ``save(mode=memory, keep_running=False)`` of that session (stream, RAM file, fsync);
- ``state``: the state directory's size on disk (``du``: the RAM file is sparse) and apparent;
- ``resume``: a session restored from the state until its first cell (``pandas.__version__``)
  returned;
- ``fork``: ``--forks`` sessions restored from one state at once until each ran the same first
  cell as ``resume``, and the PSS of their QEMU processes together (``/proc/PID/smaps_rollup``)
  against one cold session's after its ``import pandas``.

Medians of ``--rounds``; ratios are of the same run. No pool: the cold session boots.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sandcell.backends.cell.state import PauseMode, RestorePoint, SavedState
from sandcell.backends.microvm import MicroVMBackend
from sandcell.backends.microvm.session import VMSessionSandbox
from sandcell.spec import Outcome, RunRequest


def _pss(box: VMSessionSandbox) -> int:
    assert box.vm is not None
    total = 0
    for pid in box.vm.pids():
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def _cell(box: VMSessionSandbox, code: str) -> None:
    run = box.run_cell(code, timeout_s=300, hard_deadline=None)
    if run.outcome is not Outcome.OK:
        raise SystemExit(f"cell failed: {run.reason}: {run.stderr[-500:]!r}")


def _open(
    backend: MicroVMBackend, request: RunRequest, restore: RestorePoint | None = None
) -> VMSessionSandbox:
    box = backend.session_sandbox(request, session_id=uuid.uuid4().hex, restore=restore)
    assert isinstance(box, VMSessionSandbox)
    box.start()
    return box


def _du(path: Path) -> tuple[int, int]:
    out = subprocess.run(
        ["du", "-sb", "--apparent-size", str(path)], capture_output=True, check=True
    )
    apparent = int(out.stdout.split()[0])
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, check=True)
    return int(out.stdout.split()[0]), apparent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="analysis")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forks", type=int, default=4)
    args = ap.parse_args()
    backend = MicroVMBackend()
    request = RunRequest(code="", runtime=args.runtime)
    root = Path(tempfile.mkdtemp(prefix="sandcell-vm-pause-bench-", dir="/var/tmp"))
    rows: dict[str, list[float]] = {"cold_ms": [], "save_ms": [], "resume_ms": []}
    state: tuple[Path, SavedState] | None = None
    cold_pss = 0
    try:
        for i in range(args.rounds):
            t0 = time.monotonic()
            box = _open(backend, request)
            try:
                _cell(box, "import pandas")
                rows["cold_ms"].append((time.monotonic() - t0) * 1000)
                cold_pss = _pss(box)
                d = root / f"state-{i}"
                d.mkdir(mode=0o700)
                t0 = time.monotonic()
                saved = box.save(d, mode=PauseMode.MEMORY, keep_running=False)
                rows["save_ms"].append((time.monotonic() - t0) * 1000)
            finally:
                box.teardown()
            state = (d, saved)
            t0 = time.monotonic()
            back = _open(backend, request, RestorePoint(state_dir=d, saved=saved))
            try:
                _cell(back, "print(pandas.__version__)")
                rows["resume_ms"].append((time.monotonic() - t0) * 1000)
            finally:
                back.teardown()
        assert state is not None
        d, saved = state
        disk, apparent = _du(d)
        forks: list[VMSessionSandbox] = []
        lock = threading.Lock()

        def one() -> None:
            b = _open(backend, request, RestorePoint(state_dir=d, saved=saved))
            with lock:
                forks.append(b)
            _cell(b, "print(pandas.__version__)")

        t0 = time.monotonic()
        threads = [threading.Thread(target=one) for _ in range(args.forks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fork_ms = (time.monotonic() - t0) * 1000
        fork_pss = sum(_pss(b) for b in forks)
        for b in forks:
            b.teardown()
        med = {k: round(statistics.median(v), 1) for k, v in rows.items()}
        report = {
            "runtime": args.runtime,
            "rounds": args.rounds,
            **med,
            "cold_over_resume": round(med["cold_ms"] / med["resume_ms"], 2),
            "state_disk_bytes": disk,
            "state_apparent_bytes": apparent,
            "stream_ms": saved.detail.get("stream_ms"),
            "forks": len(forks),
            "forks_ms": round(fork_ms, 1),
            "forks_over_resume": round(fork_ms / med["resume_ms"], 2),
            "cold_session_pss_bytes": cold_pss,
            "forks_pss_bytes": fork_pss,
            "forks_pss_over_one": round(fork_pss / cold_pss, 2) if cold_pss else None,
            "raw": rows,
        }
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
