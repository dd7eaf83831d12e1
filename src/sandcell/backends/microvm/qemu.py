"""QEMU: finding it, and the command line of one microVM, as pure data.

The machine is QEMU's ``microvm`` with virtio-mmio devices only: the read-only root disk
(virtio-blk) and one virtio-serial port for the agent's channel. No network device, no PCI, no
USB, no option ROMs, no default devices; the serial console goes to QEMU's stdout (read by the host
for diagnostics only). :func:`build_argv` is the whole command line, unit-tested without QEMU.

For snapshots the guest RAM is a file (``memory-backend-file``): the VM that is saved maps it
shared (its RAM is the file), each clone maps it private (copy-on-write) and starts with
``-incoming defer``. :func:`snapshot_identity` is the command line with the per-VM paths and those
two differences blanked, which a restore must match exactly.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from sandcell.errors import IsolationUnavailable

MACHINE = "microvm,x-option-roms=off,isa-serial=on,rtc=on"
CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf-lm"
"""QEMU's baseline CPU with the x86-64-v2 features numpy 2 requires (SIGILL without them)."""
PORT_NAME = "sandcell"


@dataclass(frozen=True, slots=True, kw_only=True)
class Qemu:
    path: str
    version: str
    """``7.2.22`` and the like."""
    version_text: str


@functools.cache
def find_qemu() -> Qemu:
    """The ``qemu-system-x86_64`` on PATH; IsolationUnavailable when there is none."""
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        raise IsolationUnavailable(
            "microvm",
            "qemu-system-x86_64 is not installed",
            "apt-get install qemu-system-x86 (or run scripts/install-vm as root)",
        )
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except OSError as exc:
        raise IsolationUnavailable(
            "microvm", f"{path} cannot run: {exc}", "reinstall QEMU"
        ) from exc
    m = re.search(r"version (\S+)", out)
    if m is None:
        raise IsolationUnavailable(
            "microvm", f"{path} --version said {out[:80]!r}", "reinstall QEMU"
        )
    return Qemu(path=path, version=m.group(1), version_text=out.splitlines()[0].strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class VMPlan:
    """Everything that decides one VM's command line."""

    qemu: str
    accel: str
    """``tcg`` or ``kvm``."""
    memory_mib: int
    vcpus: int
    kernel: Path
    initrd: Path
    image: Path
    append: str
    """The kernel command line."""
    channel: Path
    """The agent channel's socket (QEMU listens)."""
    qmp: Path | None = None
    """QEMU's control socket, for snapshots."""
    ram_file: Path | None = None
    """Guest RAM backed by this file (snapshots)."""
    ram_shared: bool = False
    """Map the RAM file shared (the VM to save) or private copy-on-write (a clone)."""
    incoming: bool = False
    """Start paused, waiting for ``migrate-incoming`` (a clone)."""
    ram_object: bool = False
    """Without a RAM file: the RAM still a memory backend object (``mem``), as a file-backed
    VM's is, so its migration stream loads into one (a session VM that may be saved)."""


def kernel_append(*, tsc_khz: int | None, preload: tuple[str, ...]) -> str:
    """The guest kernel's command line."""
    parts = [
        "console=ttyS0",
        "quiet",
        "loglevel=1",
        "nokaslr",
        "panic=-1",
        "rdinit=/init",
        "8250.nr_uarts=1",
        "cryptomgr.notests",
        "random.trust_cpu=off",
    ]
    if tsc_khz:
        parts.append(f"tsc_early_khz={tsc_khz}")
    if preload:
        parts.append("sandcell.preload=" + ",".join(preload))
    return " ".join(parts)


def build_argv(plan: VMPlan) -> list[str]:
    """QEMU's argument list for ``plan``."""
    machine = MACHINE
    argv = [plan.qemu, "-nodefaults", "-no-user-config", "-no-reboot"]
    if plan.ram_file is not None:
        share = "on" if plan.ram_shared else "off"
        argv += [
            "-object",
            f"memory-backend-file,id=mem,size={plan.memory_mib}M,mem-path={plan.ram_file},"
            f"share={share}",
        ]
        machine += ",memory-backend=mem"
    elif plan.ram_object:
        argv += ["-object", f"memory-backend-ram,id=mem,size={plan.memory_mib}M"]
        machine += ",memory-backend=mem"
    argv += [
        "-M",
        machine,
        "-accel",
        plan.accel,
        "-cpu",
        CPU if plan.accel == "tcg" else "host",
        "-m",
        f"{plan.memory_mib}M",
        "-smp",
        str(plan.vcpus),
        "-display",
        "none",
        "-serial",
        "stdio",
        "-monitor",
        "none",
        "-kernel",
        str(plan.kernel),
        "-initrd",
        str(plan.initrd),
        "-append",
        plan.append,
        "-drive",
        f"id=root,file={plan.image},format=raw,if=none,readonly=on",
        "-device",
        "virtio-blk-device,drive=root",
        "-device",
        "virtio-serial-device,max_ports=2",
        "-chardev",
        f"socket,id=chan,path={plan.channel},server=on,wait=off",
        "-device",
        f"virtserialport,chardev=chan,name={PORT_NAME}",
    ]
    if plan.qmp is not None:
        argv += ["-qmp", f"unix:{plan.qmp},server=on,wait=off"]
    if plan.incoming:
        argv += ["-incoming", "defer"]
    return argv


def snapshot_identity(plan: VMPlan) -> list[str]:
    """The command line a snapshot was taken with, without what differs per VM."""
    neutral = replace(
        plan,
        channel=Path("CHANNEL"),
        qmp=Path("QMP"),
        ram_file=Path("RAM"),
        ram_shared=False,
        incoming=False,
        ram_object=False,
    )
    return build_argv(neutral)


def parse_tsc_khz(dmesg: str, cpuinfo: str) -> int | None:
    """The host's TSC frequency in kHz: the kernel's refined calibration, else its detected
    value, else the CPU's nominal MHz (a guest with a wrong value keeps time too fast)."""
    for pattern in (
        r"Refined TSC clocksource calibration: ([0-9.]+) MHz",
        r"tsc: Detected ([0-9.]+) MHz",
    ):
        found = re.findall(pattern, dmesg)
        if found:
            return round(float(found[-1]) * 1000)
    m = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo, re.MULTILINE)
    return round(float(m.group(1)) * 1000) if m else None


@functools.cache
def host_tsc_khz() -> int | None:
    """:func:`parse_tsc_khz` of this host (dmesg may be closed to ordinary users)."""
    try:
        dmesg = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        dmesg = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return parse_tsc_khz(dmesg, cpuinfo)


__all__ = [
    "Qemu",
    "VMPlan",
    "build_argv",
    "find_qemu",
    "host_tsc_khz",
    "kernel_append",
    "parse_tsc_khz",
    "snapshot_identity",
]
