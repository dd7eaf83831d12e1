"""Choosing the accelerator: KVM where it really works, TCG otherwise, decided by booting.

A ``/dev/kvm`` node is not proof: on a host that is itself a VM without nested VT-x/AMD-V, KVM
may be para-virtualised and run guests about 70 times slower than TCG. So KVM is tried only where
the CPU advertises ``vmx`` or ``svm`` and ``/dev/kvm`` opens, and then a guest must boot to its
agent within :data:`KVM_BOOT_BUDGET_S` under KVM; anything else is TCG. ``SANDCELL_VM_ACCEL``
(``tcg`` or ``kvm``) overrides the choice.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandcell.errors import ConfigError

KVM_BOOT_BUDGET_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    accel: str
    why: str


def cpu_virtualisation(cpuinfo: str) -> bool:
    """Whether the CPU flags include hardware virtualisation (vmx or svm)."""
    return re.search(r"^flags\s*:.*\b(vmx|svm)\b", cpuinfo, re.MULTILINE) is not None


def decide(
    *, override: str | None, cpuinfo: str, kvm_opens: bool, boot_kvm: Callable[[], float | None]
) -> Choice:
    """The accelerator (pure, the boot injected): ``boot_kvm`` returns seconds to ready or None."""
    if override:
        if override not in ("tcg", "kvm"):
            raise ConfigError(f"SANDCELL_VM_ACCEL={override!r}: choose tcg or kvm")
        return Choice(accel=override, why="chosen by SANDCELL_VM_ACCEL")
    if not cpu_virtualisation(cpuinfo):
        return Choice(accel="tcg", why="the CPU has no vmx/svm: KVM here would be para-virtualised")
    if not kvm_opens:
        return Choice(accel="tcg", why="/dev/kvm cannot be opened by this user")
    took = boot_kvm()
    if took is None or took > KVM_BOOT_BUDGET_S:
        return Choice(accel="tcg", why="a test guest did not boot under KVM in time")
    return Choice(accel="kvm", why=f"a test guest booted under KVM in {took:.2f} s")


def _kvm_opens() -> bool:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


@functools.cache
def choose(boot_kvm: Callable[[], float | None]) -> Choice:
    """:func:`decide` for this host, once per process."""
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        cpuinfo = ""
    return decide(
        override=os.environ.get("SANDCELL_VM_ACCEL"),
        cpuinfo=cpuinfo,
        kvm_opens=_kvm_opens(),
        boot_kvm=boot_kvm,
    )


def timed(fn: Callable[[], object]) -> float | None:
    """Seconds ``fn`` took, or None when it raised."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception:
        return None
    return time.monotonic() - t0


__all__ = ["Choice", "choose", "cpu_virtualisation", "decide", "timed"]
