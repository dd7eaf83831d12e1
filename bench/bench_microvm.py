"""microVM: sandcell's microVM backend against a bare QEMU boot of the same kernel, in one run.

    .venv/bin/python bench/bench_microvm.py [--runs N] [--json] [--pool-only]

Needs the guest (``scripts/install-vm``, ``sandcell vm build``). Measures, interleaved round by
round so that load from other work on the host hits every variant alike:

* ``bare qemu boot``: QEMU with the same machine, CPU, memory and kernel, and an initramfs whose
  init only powers the guest off: kernel boot to userspace and back, nothing of sandcell;
* ``microvm cold``: ``MicroVMBackend().run`` of ``print(1)`` (boot, root image, agent, runner,
  the program, teardown);
* ``microvm pool``: the same from the pool (restored from the snapshot, warmed, paused, resumed),
  end to end through ``Executor.run``; also ``import pandas`` from the pool (preloaded).

Then fresh runs per second from the pool at 1 and 2 callers (back to back: the refill is part of
the cost), and the idle memory (PSS) of one ready VM against its guest memory size, split by where
it comes from (``pss_parts``: guest RAM still shared with the snapshot file, guest RAM the clone
copied, TCG's translated code, QEMU's other anonymous memory, its binary and libraries), and
whether the host has KSM and runs it. Prints the ratios the issue sets targets for: pool median
<= 125 ms, cold / bare boot <= 1.2, idle PSS far below guest memory (issue 25: <= 40 MiB).

``--jit`` adds what a pooled ``print(1)`` still makes TCG translate (QEMU's ``info jit`` over
QMP when the VM is taken and when its last frame arrives: translation blocks and host code) and
the QEMU CPU time from the take to that frame: a load-independent view of the run's cost that the
pool's warm-up (``_runner.warm``, ``guest/warm.py``) exists to cut.

``--pool-only`` leaves out the bare boot and the cold runs (seconds each under TCG): the pooled
figures alone, for before/after runs alternated with another tree (``PYTHONPATH``) or guest
(``SANDCELL_VM_DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _machine import descendants

from sandcell import Executor, RunRequest, WarmConfig
from sandcell.backends.microvm import (
    MicroVMBackend,
    channel,
    image,
    initramfs,
    machine,
    pool,
    qemu,
    snapshot,
)
from sandcell.backends.microvm.pool import SNAPSHOT_MEMORY_BYTES
from sandcell.backends.microvm.vm import VM

PRINT = "print(1)"
PANDAS = "import pandas; print(pandas.__version__)"


def bare_boot_argv(guest: machine.Guest, initrd: Path, memory_mib: int) -> list[str]:
    return [
        guest.qemu.path,
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-M",
        qemu.MACHINE,
        "-accel",
        guest.accel,
        "-cpu",
        qemu.CPU,
        "-m",
        f"{memory_mib}M",
        "-display",
        "none",
        "-serial",
        "null",
        "-monitor",
        "none",
        "-kernel",
        str(guest.files.kernel),
        "-initrd",
        str(initrd),
        "-append",
        qemu.kernel_append(tsc_khz=guest.tsc_khz, preload=()),
    ]


def bare_initrd(path: Path) -> None:
    init = b"#!/bin/busybox sh\n/bin/busybox poweroff -f\n"
    entries = [
        initramfs.Entry("dev", 0o40755),
        initramfs.Entry("dev/console", 0o20600, rdev=(5, 1)),
        initramfs.Entry("bin", 0o40755),
        initramfs.Entry("bin/busybox", 0o100755, Path("/bin/busybox").read_bytes()),
        initramfs.Entry("init", 0o100755, init),
    ]
    path.write_bytes(initramfs.cpio_newc(entries))


def pss_parts(pid: int, ram_file: Path) -> dict[str, float]:
    """A QEMU process's PSS in MiB by where it comes from (see module)."""
    parts = dict.fromkeys(
        ("guest_ram_shared", "guest_ram_copied", "tcg_code", "qemu_anon", "qemu_files"), 0.0
    )
    name, perms = "", ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if not fields[0].endswith(":"):
                perms = fields[1]
                name = fields[5] if len(fields) > 5 else ""
                continue
            key = fields[0]
            if key not in ("Pss:", "Anonymous:"):
                continue
            kib = int(fields[1])
            if name == str(ram_file):
                # A page the clone copied is its own (Anonymous, all of it in its Pss); the
                # rest of its Pss is the file's pages, divided among the clones mapping them.
                if key == "Pss:":
                    parts["guest_ram_shared"] += kib / 1024
                elif key == "Anonymous:":
                    parts["guest_ram_copied"] += kib / 1024
                    parts["guest_ram_shared"] -= kib / 1024
            elif key == "Pss:":
                if not name or name.startswith("["):
                    parts["tcg_code" if "x" in perms else "qemu_anon"] += kib / 1024
                else:
                    parts["qemu_files"] += kib / 1024
    return {k: round(v, 1) for k, v in parts.items()}


def ksm_state() -> str:
    """Whether the host kernel has KSM (same-page merging) and runs it."""
    run = Path("/sys/kernel/mm/ksm/run")
    if not run.exists():
        return "absent"
    return "running" if run.read_text().strip() == "1" else "present, not running"


def idle_pss_parts(snapshot_dir: object) -> dict[str, float]:
    """:func:`pss_parts` of one of this process's ready QEMUs (another process's clones of
    the same snapshot would share its pages too: only this process's are looked at)."""
    if not isinstance(snapshot_dir, str):
        return {}
    ram = Path(snapshot_dir) / "ram"
    mine = set(descendants(os.getpid()))
    for pid in snapshot.qemus_naming(Path(snapshot_dir)):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if pid in mine and Path(exe).name.startswith("qemu-system"):
            return pss_parts(pid, ram)
    return {}


def _jit(vm: VM) -> tuple[int, int]:
    """(translation blocks, bytes of host code) of a VM's TCG so far."""
    assert vm.qmp is not None
    text = vm.qmp.execute(
        "human-monitor-command",
        deadline=time.monotonic() + 10,
        **{"command-line": "info jit"},
    )
    size = re.search(r"gen code size\s+(\d+)", text)
    count = re.search(r"TB count\s+(\d+)", text)
    return (int(count.group(1)) if count else -1, int(size.group(1)) if size else -1)


def _cpu_ms(pid: int) -> float:
    """CPU time of all of a process's threads, in ns from schedstat (not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def translation_per_run(ex: Executor, ready: object, runs: int) -> dict[str, float]:
    """Medians over ``runs`` pooled ``print(1)``: blocks and KiB of host code translated, and
    QEMU's CPU ms, from the take to the agent's last frame (see module)."""
    seen: dict[str, object] = {}
    rows: dict[str, list[float]] = {"blocks": [], "code_kib": [], "qemu_cpu_ms": []}
    take, recv = pool.WarmVMs.take, channel.Channel.recv

    def taking(self: pool.WarmVMs, request: RunRequest) -> object:
        got = take(self, request)
        if not isinstance(got, str):
            vm = got[0]
            seen.update(vm=vm, pid=vm.pids()[-1], jit=_jit(vm))
            seen["cpu"] = _cpu_ms(seen["pid"])  # type: ignore[arg-type]
        return got

    def receiving(self: channel.Channel, deadline: float) -> tuple[bytes, bytes]:
        kind, payload = recv(self, deadline)
        if kind == channel.DONE and "vm" in seen:
            blocks, code = _jit(seen["vm"])  # type: ignore[arg-type]
            b0, c0 = seen["jit"]  # type: ignore[misc]
            rows["blocks"].append(blocks - b0)
            rows["code_kib"].append((code - c0) / 1024)
            rows["qemu_cpu_ms"].append(_cpu_ms(seen["pid"]) - seen["cpu"])  # type: ignore[arg-type,operator]
        return kind, payload

    pool.WarmVMs.take, channel.Channel.recv = taking, receiving  # type: ignore[assignment,method-assign]
    try:
        for _ in range(runs):
            ready()  # type: ignore[operator]
            seen.clear()
            if ex.run(RunRequest(code=PRINT)).stdout != "1\n":
                raise RuntimeError("a pooled run failed")
    finally:
        pool.WarmVMs.take, channel.Channel.recv = take, recv  # type: ignore[method-assign]
    return {k: round(statistics.median(v), 1) for k, v in rows.items() if v}


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) * 1000


def stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "median_ms": round(statistics.median(s), 1),
        "p90_ms": round(s[min(len(s) - 1, int(len(s) * 0.9))], 1),
        "n": len(s),
    }


def rate(ex: Executor, callers: int, total: int) -> float:
    done = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal done
        while True:
            with lock:
                if done >= total:
                    return
                done += 1
            r = ex.run(RunRequest(code=PRINT))
            if r.stdout != "1\n":
                raise RuntimeError(f"a pooled run failed: {r.reason}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="rounds of the latency comparison")
    p.add_argument("--rate-runs", type=int, default=10, help="runs per throughput measurement")
    p.add_argument("--json", action="store_true")
    p.add_argument("--pool-only", action="store_true", help="no bare boot, no cold runs")
    p.add_argument("--jit", action="store_true", help="TCG translation and CPU per pooled run")
    args = p.parse_args()

    cold = MicroVMBackend()
    pooled = MicroVMBackend(warm=WarmConfig(mode="pool", pool_size=2))
    home = Path(tempfile.mkdtemp(prefix="sandcell-bench-vm-"))
    ex = Executor(home=home / "pool", profile="unchecked", backend=pooled)
    cold_ex = Executor(home=home / "cold", profile="unchecked", backend=cold)
    guest = cold.guest
    memory_mib = machine.guest_mib(SNAPSHOT_MEMORY_BYTES)
    bare_rd = home / "bare.cpio"
    bare_initrd(bare_rd)

    def bare() -> None:
        subprocess.run(bare_boot_argv(guest, bare_rd, memory_mib), check=True, timeout=300)

    def cold_run() -> None:
        r = cold.run(RunRequest(code=PRINT), run_id=uuid.uuid4().hex, collect=lambda _: ((), ()))
        if r.stdout != b"1\n":
            raise RuntimeError(f"a cold run failed: {r.reason}")

    def wait_pool() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            s = pooled.warm_stats()
            if s is not None and s.pool is not None and s.pool.ready >= s.pool.size:
                return
            time.sleep(0.05)
        raise RuntimeError("the pool did not fill")

    def pool_run(code: str) -> float:
        wait_pool()
        t0 = time.perf_counter()
        r = ex.run(RunRequest(code=code))
        took = (time.perf_counter() - t0) * 1000
        if r.outcome.value != "ok" or r.start.mode != "pool":
            raise RuntimeError(f"a pooled run failed: {r.reason}")
        return took

    wait_pool()
    pool_run(PRINT)  # the first run after the snapshot pays for nothing the others do not
    samples: dict[str, list[float]] = {"pool": [], "pool_pandas": []}
    if not args.pool_only:
        samples |= {"bare": [], "cold": []}
    for _ in range(args.runs):
        if not args.pool_only:
            samples["bare"].append(timed(bare))
            samples["cold"].append(timed(cold_run))
        samples["pool"].append(pool_run(PRINT))
        samples["pool_pandas"].append(pool_run(PANDAS))
    # More pool samples: cheap, and the target is about this median.
    for _ in range(args.runs * 2):
        samples["pool"].append(pool_run(PRINT))

    wait_pool()
    st = pooled.warm_stats()
    assert st is not None and st.pool is not None
    idle_pss = st.pool.idle_pss_bytes / max(st.pool.ready, 1)
    parts = idle_pss_parts(st.template_state.get("snapshot_dir"))
    rates = {str(c): round(rate(ex, c, args.rate_runs), 2) for c in (1, 2)}
    jit = translation_per_run(ex, wait_pool, args.runs * 2) if args.jit else None
    results: dict[str, object] = {
        "host": {"accelerator": guest.accel, "tsc_khz": guest.tsc_khz},
        "versions": dict(pooled.versions()),
        "latency": {k: stats(v) for k, v in samples.items()},
        "runs_per_s": rates,
        "idle_pss_per_vm_mib": round(idle_pss / 2**20, 1),
        "idle_pss_parts_mib": parts,
        "ksm": ksm_state(),
        **({"pooled_print_translation": jit} if jit is not None else {}),
        "guest_memory_mib": memory_mib,
        "image_mib": image.load_manifest().image_bytes // 2**20,
    }
    lat = results["latency"]
    assert isinstance(lat, dict)
    ratios = {"idle_pss_over_guest_memory": round(idle_pss / (memory_mib * 2**20), 3)}
    targets = {
        "pool_median_le_125ms": lat["pool"]["median_ms"] <= 125,
        "idle_pss_le_40mib": idle_pss <= 40 * 2**20,
    }
    if not args.pool_only:
        ratios["cold_over_bare_boot"] = round(
            lat["cold"]["median_ms"] / lat["bare"]["median_ms"], 2
        )
        ratios["pool_over_cold"] = round(lat["pool"]["median_ms"] / lat["cold"]["median_ms"], 3)
        targets["cold_within_1_2x_bare_boot"] = ratios["cold_over_bare_boot"] <= 1.2
    results["ratios"], results["targets"] = ratios, targets
    results["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    ex.close()
    cold_ex.close()
    shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for key, value in results.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
