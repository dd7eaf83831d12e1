"""The microVM backend's pure plans: QEMU's command line, the jail, the accelerator, the TSC."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandcell.backends.microvm import accel, qemu
from sandcell.backends.microvm.jail import SANDBOX_OPTS, jail_argv
from sandcell.errors import ConfigError


def _plan(**changes: object) -> qemu.VMPlan:
    base: dict[str, object] = {
        "qemu": "/usr/bin/qemu-system-x86_64",
        "accel": "tcg",
        "memory_mib": 704,
        "vcpus": 1,
        "kernel": Path("/vm/kernel/vmlinuz"),
        "initrd": Path("/vm/image/initrd.cpio"),
        "image": Path("/vm/image/root.ext4"),
        "append": qemu.kernel_append(tsc_khz=2100000, preload=("numpy", "pandas")),
        "channel": Path("/run/x/chan.sock"),
    }
    base.update(changes)
    return qemu.VMPlan(**base)  # type: ignore[arg-type]


def test_argv_has_no_network_pci_or_usb_and_a_read_only_root() -> None:
    argv = qemu.build_argv(_plan())
    text = " ".join(argv)
    assert "-nodefaults" in argv and "-no-user-config" in argv
    for forbidden in ("-netdev", "-nic", "-net ", "pci", "usb", "virtio-net"):
        assert forbidden not in text, forbidden
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert all(
        d.startswith(("virtio-blk-device", "virtio-serial-device", "virtserialport"))
        for d in devices
    )
    drive = argv[argv.index("-drive") + 1]
    assert "readonly=on" in drive and "if=none" in drive
    assert argv[argv.index("-M") + 1].startswith("microvm,x-option-roms=off")
    assert argv[argv.index("-accel") + 1] == "tcg"
    assert argv[argv.index("-cpu") + 1].startswith("qemu64")
    assert "-incoming" not in argv and "-qmp" not in argv


def test_kernel_command_line_carries_tsc_and_preload() -> None:
    append = qemu.kernel_append(tsc_khz=2100000, preload=("numpy",))
    assert "tsc_early_khz=2100000" in append.split()
    assert "sandcell.preload=numpy" in append.split()
    assert "tsc_early_khz" not in qemu.kernel_append(tsc_khz=None, preload=())


def test_snapshot_and_clone_plans_share_one_identity() -> None:
    saved = _plan(ram_file=Path("/dev/shm/s/ram"), ram_shared=True, qmp=Path("/a/qmp"))
    clone = _plan(
        ram_file=Path("/dev/shm/s/ram"),
        ram_shared=False,
        incoming=True,
        qmp=Path("/b/qmp"),
        channel=Path("/b/chan.sock"),
    )
    assert "share=on" in " ".join(qemu.build_argv(saved))
    clone_argv = qemu.build_argv(clone)
    assert "share=off" in " ".join(clone_argv)
    assert clone_argv[-2:] == ["-incoming", "defer"]
    assert qemu.snapshot_identity(saved) == qemu.snapshot_identity(clone)
    # A different memory size, CPU or kernel command line is another identity.
    assert qemu.snapshot_identity(_plan(memory_mib=512)) != qemu.snapshot_identity(_plan())
    other = _plan(append=qemu.kernel_append(tsc_khz=2100000, preload=()))
    assert qemu.snapshot_identity(other) != qemu.snapshot_identity(_plan())


@pytest.mark.parametrize(
    ("dmesg", "cpuinfo", "khz"),
    [
        ("[0.0] tsc: Detected 2100.000 MHz processor\n", "", 2100000),
        (
            "tsc: Detected 2793.000 MHz processor\n"
            "tsc: Refined TSC clocksource calibration: 2793.437 MHz\n",
            "",
            2793437,
        ),
        ("", "processor: 0\ncpu MHz\t\t: 2400.125\n", 2400125),
        ("", "", None),
    ],
)
def test_tsc_frequency_from_the_kernel_log(dmesg: str, cpuinfo: str, khz: int | None) -> None:
    assert qemu.parse_tsc_khz(dmesg, cpuinfo) == khz


def test_jail_argv_unshares_the_network_and_binds_only_what_qemu_needs() -> None:
    argv = jail_argv(
        bwrap="/usr/bin/bwrap",
        qemu_argv=["/usr/bin/qemu-system-x86_64", "-M", "microvm"],
        ro_paths=[Path("/vm/kernel/vmlinuz")],
        rw_paths=[Path("/tmp/run")],
        root_links=[("/lib", "usr/lib")],
        kvm=False,
    )
    assert "--unshare-net" in argv and "--unshare-user" in argv and "--unshare-pid" in argv
    assert "--die-with-parent" in argv
    sep = argv.index("--")
    jail, command = argv[:sep], argv[sep + 1 :]
    assert command[:3] == ["/usr/bin/qemu-system-x86_64", "-M", "microvm"]
    assert command[-2:] == ["-sandbox", SANDBOX_OPTS]
    assert "spawn=deny" in SANDBOX_OPTS
    binds = [(jail[i + 1], jail[i + 2]) for i, a in enumerate(jail) if a in ("--ro-bind", "--bind")]
    assert ("/usr", "/usr") in binds
    assert ("/vm/kernel/vmlinuz", "/vm/kernel/vmlinuz") in binds
    assert ("/tmp/run", "/tmp/run") in binds
    assert all(src not in ("/", "/home", "/root", "/etc") for src, _ in binds)
    assert "/dev/kvm" not in jail


def test_accelerator_is_decided_by_booting_not_by_the_device_node() -> None:
    no_vmx = "flags : fpu sse2 hypervisor\n"
    vmx = "flags : fpu sse2 vmx\n"

    def never() -> float | None:
        raise AssertionError("must not boot without vmx/svm")

    assert (
        accel.decide(override=None, cpuinfo=no_vmx, kvm_opens=True, boot_kvm=never).accel == "tcg"
    )
    assert accel.decide(override=None, cpuinfo=vmx, kvm_opens=False, boot_kvm=never).accel == "tcg"
    slow = accel.decide(override=None, cpuinfo=vmx, kvm_opens=True, boot_kvm=lambda: 60.0)
    assert slow.accel == "tcg" and "did not boot" in slow.why
    assert (
        accel.decide(override=None, cpuinfo=vmx, kvm_opens=True, boot_kvm=lambda: None).accel
        == "tcg"
    )
    fast = accel.decide(override=None, cpuinfo=vmx, kvm_opens=True, boot_kvm=lambda: 0.4)
    assert fast.accel == "kvm"
    assert accel.decide(override="tcg", cpuinfo=vmx, kvm_opens=True, boot_kvm=never).accel == "tcg"
    with pytest.raises(ConfigError, match="SANDCELL_VM_ACCEL"):
        accel.decide(override="hvf", cpuinfo=vmx, kvm_opens=True, boot_kvm=never)
