"""microVM: sandcell's microVM backend against a bare QEMU boot of the same kernel, in one run.

    .venv/bin/python bench/bench_microvm.py [--runs N] [--json]

Needs the guest (``scripts/install-vm``, ``sandcell vm build``). Measures, interleaved round by
round so that load from other work on the host hits every variant alike:

* ``bare qemu boot``: QEMU with the same machine, CPU, memory and kernel, and an initramfs whose
  init only powers the guest off: kernel boot to userspace and back, nothing of sandcell;
* ``microvm cold``: ``MicroVMBackend().run`` of ``print(1)`` (boot, root image, agent, runner,
  the program, teardown);
* ``microvm pool``: the same from the pool (restored from the snapshot, warmed, paused, resumed),
  end to end through ``Executor.run``; also ``import pandas`` from the pool (preloaded).

Then fresh runs per second from the pool at 1 and 2 callers (back to back: the refill is part of
the cost), and the idle memory (PSS) of one ready VM against its guest memory size. Prints the
ratios the issue sets targets for: pool median <= 125 ms, cold / bare boot <= 1.2, idle PSS far
below guest memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sandcell import Executor, RunRequest, WarmConfig
from sandcell.backends.microvm import MicroVMBackend, image, initramfs, machine, qemu
from sandcell.backends.microvm.pool import SNAPSHOT_MEMORY_BYTES

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
    samples: dict[str, list[float]] = {"bare": [], "cold": [], "pool": [], "pool_pandas": []}
    for _ in range(args.runs):
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
    rates = {str(c): round(rate(ex, c, args.rate_runs), 2) for c in (1, 2)}
    results: dict[str, object] = {
        "host": {"accelerator": guest.accel, "tsc_khz": guest.tsc_khz},
        "versions": dict(pooled.versions()),
        "latency": {k: stats(v) for k, v in samples.items()},
        "runs_per_s": rates,
        "idle_pss_per_vm_mib": round(idle_pss / 2**20, 1),
        "guest_memory_mib": memory_mib,
        "image_mib": image.load_manifest().image_bytes // 2**20,
    }
    lat = results["latency"]
    assert isinstance(lat, dict)
    results["ratios"] = {
        "cold_over_bare_boot": round(lat["cold"]["median_ms"] / lat["bare"]["median_ms"], 2),
        "pool_over_cold": round(lat["pool"]["median_ms"] / lat["cold"]["median_ms"], 3),
        "idle_pss_over_guest_memory": round(idle_pss / (memory_mib * 2**20), 3),
    }
    results["targets"] = {
        "pool_median_le_125ms": lat["pool"]["median_ms"] <= 125,
        "cold_within_1_2x_bare_boot": results["ratios"]["cold_over_bare_boot"] <= 1.2,  # type: ignore[index]
    }
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
