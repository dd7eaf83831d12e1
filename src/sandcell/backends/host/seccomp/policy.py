"""The seccomp policy of one architecture: the allowlist, the named refusals and the argument rules
put together, checked for consistency and compiled.

Decisions, in the order the compiled program takes them: a foreign ABI (x32 included) kills the
process; an argument-filtered call (clone, socket, ioctl, personality) is refused with EPERM when
a rule matches and allowed otherwise; a call refused by name gets EPERM (ENOSYS for clone3, so
that libc falls back to clone); an allowlisted call is allowed; every other number gets ENOSYS.
ENOSYS is what the kernel itself answers for a call it does not have, so a program (or libc)
probing for a newer call than this list knows falls back to an older one instead of failing.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Final

from sandcell.backends.host.seccomp.allowlist import ALLOWED
from sandcell.backends.host.seccomp.bpf import (
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    ArgBlock,
    FilterSpec,
    compile_filter,
)
from sandcell.backends.host.seccomp.rules import (
    ARG_RULES,
    DENIED,
    ENOSYS_REFUSED,
    ArgRule,
    DeniedSyscall,
)
from sandcell.backends.host.seccomp.syscalls import AUDIT_ARCH, SYSCALL_NUMBERS, unsupported

__all__ = [
    "SETUP_ALLOWED",
    "SeccompPolicy",
    "build_policy",
    "build_setup_policy",
]

_EPERM: Final = SECCOMP_RET_ERRNO | errno.EPERM
_ENOSYS: Final = SECCOMP_RET_ERRNO | errno.ENOSYS


@dataclass(frozen=True, slots=True, kw_only=True)
class SeccompPolicy:
    """The rule table for one architecture. Build it with :func:`build_policy`."""

    arch: str
    allowed: tuple[str, ...]
    """Allowed whatever the arguments, except the argument-filtered ones among them."""
    denied: tuple[DeniedSyscall, ...]
    """Refused with EPERM whatever the arguments."""
    arg_rules: tuple[ArgRule, ...]
    """Refused with EPERM when their arguments match; allowed otherwise. Each is allowlisted."""
    enosys: tuple[DeniedSyscall, ...]
    """Refused with ENOSYS, so that libc falls back to an older, filterable call."""

    def __post_init__(self) -> None:
        table = SYSCALL_NUMBERS.get(self.arch)
        if table is None:
            raise unsupported(self.arch)
        seen: set[str] = set()
        named = (*self.allowed, *(d.name for d in self.denied), *(d.name for d in self.enosys))
        for name in named:
            if name not in table:
                raise ValueError(f"syscall {name} has no number on {self.arch}")
            if name in seen:
                raise ValueError(f"syscall {name} appears twice in the seccomp policy")
            seen.add(name)
        # An argument-filtered call is an allowed one (so, by the check above, never refused by
        # name): its block ends in ALLOW when no rule matches.
        for rule in self.arg_rules:
            if rule.name not in self.allowed:
                raise ValueError(
                    f"syscall {rule.name} is argument-filtered but not allowlisted; "
                    "add it to the allowlist or refuse it by name"
                )

    @property
    def audit_arch(self) -> int:
        """The AUDIT_ARCH_* value the kernel reports for this architecture's native ABI."""
        return AUDIT_ARCH[self.arch]

    @property
    def denied_count(self) -> int:
        """Syscalls refused by name (EPERM or ENOSYS); unnamed calls are refused too."""
        return len(self.denied) + len(self.enosys)

    @property
    def arg_filtered_names(self) -> tuple[str, ...]:
        """Syscalls refused only for some arguments, in rule order, without repeats."""
        return tuple(dict.fromkeys(r.name for r in self.arg_rules))

    def describe(self) -> str:
        """One line for the enforcement report, e.g. ``seccomp-bpf allowlist: 268 syscalls ...``."""
        filtered = self.arg_filtered_names
        return (
            f"seccomp-bpf allowlist: {len(self.allowed)} syscalls allowed "
            f"({len(filtered)} argument-filtered: {', '.join(filtered)}), "
            f"{self.denied_count} refused by name, every other call ENOSYS, "
            f"foreign ABIs killed ({self.arch})"
        )

    def spec(self) -> FilterSpec:
        """The policy as the compiler's input: an action per number, argument blocks, default."""
        numbers = SYSCALL_NUMBERS[self.arch]
        filtered = set(self.arg_filtered_names)
        actions = {
            numbers[name]: SECCOMP_RET_ALLOW for name in self.allowed if name not in filtered
        }
        actions.update({numbers[d.name]: _EPERM for d in self.denied})
        actions.update({numbers[d.name]: _ENOSYS for d in self.enosys})
        blocks = tuple(
            ArgBlock(
                nr=numbers[name],
                alternatives=tuple(r.when for r in self.arg_rules if r.name == name),
                on_match=_EPERM,
                otherwise=SECCOMP_RET_ALLOW,
            )
            for name in self.arg_filtered_names
        )
        return FilterSpec(
            audit_arch=self.audit_arch,
            kill_x32=self.arch == "x86_64",
            arg_blocks=blocks,
            actions=actions,
            default=_ENOSYS,
        )

    def compile(self) -> bytes:
        """The classic-BPF program: the ``struct sock_filter`` array ``bwrap --seccomp`` reads."""
        return compile_filter(self.spec())


def build_policy(arch: str) -> SeccompPolicy:
    """The sandbox's seccomp rules for ``arch`` (``"x86_64"`` or ``"aarch64"``).

    Calls missing from the architecture (``iopl``, ``open`` on aarch64...) are left out. Raises
    :class:`IsolationUnavailable` for any other architecture.
    """
    table = SYSCALL_NUMBERS.get(arch)
    if table is None:
        raise unsupported(arch)
    names = [name for group in ALLOWED for name in group.names]
    unknown = [name for name in names if all(name not in t for t in SYSCALL_NUMBERS.values())]
    if unknown:
        raise ValueError(f"allowlisted syscalls {unknown} have no number on any architecture")
    return SeccompPolicy(
        arch=arch,
        allowed=tuple(name for name in names if name in table),
        denied=tuple(d for d in DENIED if d.name in table),
        arg_rules=tuple(r for r in ARG_RULES if r.name in table),
        enosys=tuple(d for d in ENOSYS_REFUSED if d.name in table),
    )


SETUP_ALLOWED: Final[tuple[str, ...]] = (
    "mount",
    "umount2",
    "unshare",
    "move_mount",
    "mount_setattr",
)
"""What the per-run setup of a warm start does after the template's fork, before the run's full
filter goes on: new namespaces, its own mounts (tmpfs, /proc, inputs moved in from the host)."""


def build_setup_policy(arch: str) -> SeccompPolicy:
    """The looser filter of a warm-start template (see ``template.py``): :func:`build_policy` with
    :data:`SETUP_ALLOWED` moved from the refusals to the allowlist. Every run forked from the
    template installs the full filter on top of it before any untrusted byte arrives; stacked
    filters all apply, so the run is held to the full one."""
    full = build_policy(arch)
    return SeccompPolicy(
        arch=arch,
        allowed=(*full.allowed, *(d.name for d in full.denied if d.name in SETUP_ALLOWED)),
        denied=tuple(d for d in full.denied if d.name not in SETUP_ALLOWED),
        arg_rules=full.arg_rules,
        enosys=full.enosys,
    )
