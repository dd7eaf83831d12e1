"""Starting guests: the pieces every VM shares (kernel, image, QEMU, accelerator, jail), a cold
boot until the agent answers, and the run directory each VM gets."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.backends.microvm import channel, layout, qemu
from sandcell.backends.microvm.image import GuestFiles, replaced
from sandcell.backends.microvm.jail import Jail
from sandcell.backends.microvm.vm import VM
from sandcell.errors import InfraError

MiB = 1 << 20
GUEST_OVERHEAD_MIB = 192
"""Guest RAM beyond the program's memory limit: kernel, agent, runner, page cache headroom."""
READY_TIMEOUT_S = float(os.environ.get("SANDCELL_VM_READY_TIMEOUT", "90"))
"""How long a booting or restored guest may take to answer (TCG on a busy host is slow)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Guest:
    """What every VM of a backend is made of."""

    files: GuestFiles
    qemu: qemu.Qemu
    accel: str
    tsc_khz: int | None
    jail: Jail | None = None


def guest_mib(memory_bytes: int) -> int:
    """Guest RAM for a program limited to ``memory_bytes``."""
    return -(-memory_bytes // MiB) + GUEST_OVERHEAD_MIB


def new_run_dir(name: str) -> Path:
    root = layout.runs_root()
    root.mkdir(mode=0o700, exist_ok=True)
    owner = root / layout.owner_tag()
    owner.mkdir(mode=0o700, exist_ok=True)
    run_dir = owner / f"{name}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(mode=0o700)
    return run_dir


def plan(
    guest: Guest,
    run_dir: Path,
    *,
    memory_mib: int,
    preload: tuple[str, ...] = (),
    ram_file: Path | None = None,
    ram_shared: bool = False,
    incoming: bool = False,
    with_qmp: bool = False,
    ram_object: bool = False,
) -> qemu.VMPlan:
    return qemu.VMPlan(
        qemu=guest.qemu.path,
        accel=guest.accel,
        memory_mib=memory_mib,
        vcpus=1,
        kernel=guest.files.kernel,
        initrd=guest.files.initrd,
        image=guest.files.image,
        append=qemu.kernel_append(tsc_khz=guest.tsc_khz, preload=preload),
        channel=run_dir / "chan.sock",
        qmp=run_dir / "qmp.sock" if with_qmp else None,
        ram_file=ram_file,
        ram_shared=ram_shared,
        incoming=incoming,
        ram_object=ram_object,
    )


def start(
    guest: Guest,
    vm_plan: qemu.VMPlan,
    run_dir: Path,
    *,
    pass_fds: Sequence[int] = (),
    ro: Sequence[Path] = (),
    rw: Sequence[Path] = (),
) -> VM:
    """Start QEMU for ``vm_plan``, jailed where the guest has a jail (``ro``/``rw``: more paths
    the jailed QEMU sees). Refused when the image was replaced since it was verified."""
    if replaced(guest.files):
        raise InfraError(
            f"the guest image {guest.files.image} was rebuilt since this sandcell verified it; "
            "the VMs it starts from now on use the new one once it is verified"
        )
    argv = qemu.build_argv(vm_plan)
    if guest.jail is None:
        vm = VM(argv, run_dir, vm_plan.channel, pass_fds=pass_fds)
        vm.plan, vm.image_sha256 = vm_plan, guest.files.manifest.image_sha256
        return vm
    jailed_argv, jailed = guest.jail.wrap(argv, vm_plan, run_dir, ro=ro, rw=rw)
    try:
        vm = VM(jailed_argv, run_dir, vm_plan.channel, pass_fds=pass_fds)
    except BaseException:
        jailed.remove()
        raise
    vm.plan, vm.image_sha256 = vm_plan, guest.files.manifest.image_sha256
    vm.cleanups.append(jailed.remove)
    try:
        jailed.attach(vm.pid)
    except BaseException:
        vm.destroy()
        raise
    return vm


def wait_ready(vm: VM, deadline: float, *, greet_only: bool = False) -> channel.Channel:
    """Connect to the agent and complete the handshake (or, ``greet_only``, wait until the agent
    answers without starting the frames: a VM about to be saved)."""
    waited = time.monotonic() - vm.started_at
    try:
        chan = vm.connect(deadline)
        if greet_only:
            chan.greet(deadline)
        else:
            chan.handshake(deadline)
    except channel.ChannelError as exc:
        waited = time.monotonic() - vm.started_at
        state = "QEMU exited" if not vm.alive() else f"no answer after {waited:.1f} s"
        raise InfraError(
            f"the guest never became ready ({state}; {exc}): {vm.console() or 'no console output'}"
        ) from None
    del waited
    return chan


def boot(guest: Guest, *, memory_mib: int, name: str, savable: bool = False) -> VM:
    """A freshly booted VM whose agent is ready for its job (``savable``: with QEMU's control
    socket and its RAM a memory object, for a session VM that may save itself)."""
    run_dir = new_run_dir(name)
    vplan = plan(guest, run_dir, memory_mib=memory_mib, with_qmp=savable, ram_object=savable)
    vm = start(guest, vplan, run_dir)
    try:
        wait_ready(vm, time.monotonic() + READY_TIMEOUT_S)
    except BaseException:
        vm.destroy()
        raise
    return vm


__all__ = ["GUEST_OVERHEAD_MIB", "Guest", "boot", "guest_mib", "new_run_dir", "plan", "start"]
