"""The seccomp-bpf filter applied to sandboxed code: which system calls it refuses, and how.

The namespaces backend hands the compiled program to bubblewrap (``bwrap --seccomp FD``), which
installs it right before it executes the user's program, so everything the code runs (and every
child it starts) inherits it and cannot remove it. The filter shrinks the kernel surface the code
can reach: it refuses the system calls a sandboxed program never needs and that have a history of
privilege-escalation bugs or that would let the code undo the other layers (new namespaces, mounts,
ptrace, eBPF, io_uring, kernel keyrings, module loading, clock and host settings...).

Everything here is pure data: :func:`build_policy` returns the rule table for an architecture and
:meth:`SeccompPolicy.compile` turns it into a classic-BPF program (the raw ``struct sock_filter``
array that ``--seccomp`` reads). Neither needs privileges, libseccomp or the kernel; the compiled
bytes are deterministic for a given architecture.

Program shape::

    arch != native AUDIT_ARCH        -> KILL_PROCESS   (i386 / x32 / AArch32 entry points)
    x86_64 and nr >= 0x40000000      -> ERRNO(EPERM)   (the x32 ABI shares x86_64's AUDIT_ARCH)
    nr in argument rules             -> ERRNO(EPERM) if an argument rule matches, else ALLOW
    nr in denied table               -> ERRNO(EPERM)
    nr == clone3                     -> ERRNO(ENOSYS)  (libc falls back to clone, which we can read)
    anything else                    -> ALLOW

Security limitations
--------------------
This is a deny list, not an allow list: a system call added to the kernel after this table was
written is allowed until someone adds it here. Argument filters only see register values, never
memory behind pointers (which is why ``clone3``, whose flags live in a struct, is refused as a
whole). The filter is defence in depth behind the namespaces, dropped capabilities, resource limits
and Landlock; it is not, on its own, a boundary, and nothing in it is meant to be the only thing
standing between the code and the host. Landlock's system calls are deliberately left allowed.
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from sandcell.errors import IsolationUnavailable

__all__ = [
    "AUDIT_ARCH",
    "SECCOMP_RET_ALLOW",
    "SECCOMP_RET_ERRNO",
    "SECCOMP_RET_KILL_PROCESS",
    "SETUP_ALLOWED",
    "SUPPORTED_ARCHES",
    "SYSCALL_NUMBERS",
    "ArgCondition",
    "ArgRule",
    "DeniedSyscall",
    "SeccompPolicy",
    "build_policy",
    "build_setup_policy",
    "native_arch",
    "syscall_number",
]

Arch = Literal["x86_64", "aarch64"]
SUPPORTED_ARCHES: Final[tuple[str, ...]] = ("x86_64", "aarch64")

# --- kernel ABI constants (linux/audit.h, linux/seccomp.h, linux/filter.h) -----------------------

AUDIT_ARCH: Final[Mapping[str, int]] = {
    "x86_64": 0xC000003E,  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    "aarch64": 0xC00000B7,  # EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
}

SECCOMP_RET_KILL_PROCESS: Final = 0x80000000
SECCOMP_RET_ERRNO: Final = 0x00050000
SECCOMP_RET_ALLOW: Final = 0x7FFF0000

# The x32 ABI reuses AUDIT_ARCH_X86_64 and marks its syscall numbers with this bit, so the
# architecture check alone does not keep it out.
_X32_SYSCALL_BIT: Final = 0x40000000

# The kernel refuses classic-BPF programs longer than this (BPF_MAXINSNS).
BPF_MAXINSNS: Final = 4096

# Classic-BPF opcodes used by the compiler (class | size | mode / class | op | src).
_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_ALU_AND_K: Final = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JMP_JA: Final = 0x05  # BPF_JMP | BPF_JA
_JMP_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JMP_JGE_K: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JMP_JSET_K: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K: Final = 0x06  # BPF_RET | BPF_K

# Offsets in struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}.
_OFF_NR: Final = 0
_OFF_ARCH: Final = 4
_OFF_ARGS: Final = 16

_U32: Final = 0xFFFFFFFF

# --- syscall numbers -----------------------------------------------------------------------------
# Only the calls this module references. x86_64 from arch/x86/entry/syscalls/syscall_64.tbl,
# aarch64 from the generic table (include/uapi/asm-generic/unistd.h). A name missing from an
# architecture's table does not exist there (aarch64 never had iopl, ioperm or uselib).

_X86_64: Final[Mapping[str, int]] = {
    "ioctl": 16,
    "socket": 41,
    "clone": 56,
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "nfsservctl": 180,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "open_tree_attr": 467,
}

_AARCH64: Final[Mapping[str, int]] = {
    "lookup_dcookie": 18,
    "ioctl": 29,
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "nfsservctl": 42,
    "chroot": 51,
    "vhangup": 58,
    "quotactl": 60,
    "acct": 89,
    "personality": 92,
    "unshare": 97,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "clock_settime": 112,
    "syslog": 116,
    "ptrace": 117,
    "reboot": 142,
    "sethostname": 161,
    "setdomainname": 162,
    "settimeofday": 170,
    "adjtimex": 171,
    "socket": 198,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "clone": 220,
    "swapon": 224,
    "swapoff": 225,
    "perf_event_open": 241,
    "fanotify_init": 262,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "clock_adjtime": 266,
    "setns": 268,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "kcmp": 272,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "open_tree_attr": 467,
}

SYSCALL_NUMBERS: Final[Mapping[str, Mapping[str, int]]] = {"x86_64": _X86_64, "aarch64": _AARCH64}
"""Architecture name to (syscall name to number), for every syscall the policy mentions."""


def _unsupported(arch: str) -> IsolationUnavailable:
    return IsolationUnavailable(
        layer="seccomp",
        reason=f"no seccomp syscall table for architecture {arch!r} "
        f"(supported: {', '.join(SUPPORTED_ARCHES)})",
        fix="run sandcell on an x86_64 or aarch64 host",
    )


def native_arch() -> str:
    """The host architecture as named in :data:`SUPPORTED_ARCHES`.

    Raises :class:`IsolationUnavailable` on any other architecture, since a filter built from the
    wrong syscall table would deny the wrong calls.
    """
    machine = platform.machine()
    if machine not in SUPPORTED_ARCHES:
        raise _unsupported(machine or "unknown")
    return machine


def syscall_number(arch: str, name: str) -> int | None:
    """The number of syscall ``name`` on ``arch``, or None if the table has no such call there."""
    table = SYSCALL_NUMBERS.get(arch)
    if table is None:
        raise _unsupported(arch)
    return table.get(name)


# --- rule table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeniedSyscall:
    """A system call refused outright with EPERM, whatever its arguments."""

    name: str
    reason: str
    """One line: why sandboxed code has no business making this call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgCondition:
    """A test on the low 32 bits of one syscall argument.

    ``any_bit``: ``arg & values[0]`` is non-zero. ``in`` / ``not_in``: ``arg & mask`` is / is not
    one of ``values``. Only the low word is examined; every argument filtered here is an ``int``
    or ``unsigned int`` in the kernel (or, for clone's flags, truncated to 32 bits by the kernel).
    """

    arg: int
    op: Literal["any_bit", "in", "not_in"]
    values: tuple[int, ...]
    mask: int = _U32

    def __post_init__(self) -> None:
        if not 0 <= self.arg <= 5:
            raise ValueError(f"syscall argument index {self.arg} is outside 0..5")
        if not self.values:
            raise ValueError("an argument condition needs at least one value")
        if self.op == "any_bit" and len(self.values) != 1:
            raise ValueError("an any_bit condition takes exactly one bit mask")
        for v in (*self.values, self.mask):
            if not 0 <= v <= _U32:
                raise ValueError(f"value {v:#x} does not fit in 32 bits")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgRule:
    """A system call refused with EPERM when all of ``when`` hold; allowed otherwise.

    Several rules for the same call are alternatives: the call is refused if any of them matches.
    """

    name: str
    reason: str
    when: tuple[ArgCondition, ...]

    def __post_init__(self) -> None:
        if not self.when:
            raise ValueError(f"argument rule for {self.name} has no condition; use DeniedSyscall")


def _deny(name: str, reason: str) -> DeniedSyscall:
    return DeniedSyscall(name=name, reason=reason)


# Refused outright. Each would either undo another isolation layer or expose a kernel subsystem
# with a long record of exploitable bugs that no ordinary program needs.
_DENIED: Final[tuple[DeniedSyscall, ...]] = (
    # Mount table: the sandbox's view of the filesystem is fixed by bubblewrap, never by the code.
    _deny("mount", "changing the mount table could expose or shadow host paths"),
    _deny("umount2", "unmounting could reveal what the sandbox's mounts hide"),
    _deny("pivot_root", "changing the root directory is for the sandbox setup only"),
    _deny("chroot", "chroot tricks are a classic way out of path-based confinement"),
    _deny("move_mount", "new mount API: attaches mounts, same risk as mount"),
    _deny("open_tree", "new mount API: clones mount trees, same risk as mount"),
    _deny("open_tree_attr", "new mount API (Linux 6.15): clones mount trees with new attributes"),
    _deny("fsopen", "new mount API: creates filesystem contexts, same risk as mount"),
    _deny("fsconfig", "new mount API: configures filesystem contexts, same risk as mount"),
    _deny("fsmount", "new mount API: creates mounts, same risk as mount"),
    _deny("fspick", "new mount API: reconfigures existing mounts"),
    _deny("mount_setattr", "new mount API: changes mount flags such as read-only"),
    # Reaching into other processes.
    _deny("ptrace", "tracing other processes bypasses every in-process restriction"),
    _deny("process_vm_readv", "reads another process's memory"),
    _deny("process_vm_writev", "writes another process's memory"),
    _deny("kcmp", "compares kernel objects across processes, a kernel-address oracle"),
    _deny("pidfd_getfd", "steals file descriptors from another process"),
    # Kernel subsystems with large attack surface.
    _deny("bpf", "eBPF programs and maps are a frequent privilege-escalation vector"),
    _deny("userfaultfd", "lets code stall the kernel mid-copy, a staple of exploit races"),
    _deny("perf_event_open", "performance counters leak kernel state and have many CVEs"),
    _deny("keyctl", "kernel keyrings are shared beyond the sandbox and have many CVEs"),
    _deny("add_key", "kernel keyrings are shared beyond the sandbox and have many CVEs"),
    _deny("request_key", "kernel keyrings can call out to host user-space helpers"),
    _deny("io_uring_setup", "io_uring bypasses syscall filtering and has many CVEs"),
    _deny("io_uring_enter", "io_uring bypasses syscall filtering and has many CVEs"),
    _deny("io_uring_register", "io_uring bypasses syscall filtering and has many CVEs"),
    # Kernel code.
    _deny("kexec_load", "loads a new kernel"),
    _deny("kexec_file_load", "loads a new kernel"),
    _deny("init_module", "loads kernel modules"),
    _deny("finit_module", "loads kernel modules"),
    _deny("delete_module", "unloads kernel modules"),
    # Namespaces: the sandbox is built once, from outside; the code may not build its own.
    _deny("unshare", "new namespaces (user namespaces above all) widen the kernel surface"),
    _deny("setns", "joining other namespaces could leave the sandbox's"),
    # File handles resolve paths outside the mount namespace (the "shocker" escape).
    _deny("open_by_handle_at", "opens files by handle, bypassing the sandbox's mounts"),
    _deny("name_to_handle_at", "produces file handles for open_by_handle_at"),
    # Host-wide settings and administration.
    _deny("acct", "process accounting is host-wide"),
    _deny("swapon", "swap configuration is host-wide"),
    _deny("swapoff", "swap configuration is host-wide"),
    _deny("reboot", "reboots or halts the host"),
    _deny("syslog", "the kernel log leaks kernel addresses and host activity"),
    _deny("quotactl", "disk quotas are host-wide"),
    _deny("quotactl_fd", "disk quotas are host-wide"),
    _deny("lookup_dcookie", "profiling interface that leaks kernel path information"),
    _deny("settimeofday", "sets the host clock"),
    _deny("clock_settime", "sets the host clock"),
    _deny("clock_adjtime", "adjusts the host clock"),
    _deny("adjtimex", "adjusts the host clock"),
    _deny("iopl", "raises the I/O privilege level, direct hardware port access"),
    _deny("ioperm", "grants direct hardware I/O port access"),
    _deny("vhangup", "hangs up the controlling terminal"),
    _deny("fanotify_init", "filesystem-wide event monitoring beyond the sandbox"),
    _deny("sethostname", "host name is for the sandbox setup only"),
    _deny("setdomainname", "domain name is for the sandbox setup only"),
    _deny("uselib", "obsolete library loader with a history of kernel bugs"),
    _deny("nfsservctl", "removed NFS server interface; nothing legitimate calls it"),
)

# The namespace bits of clone(2)'s flags (linux/sched.h).
CLONE_NEWTIME: Final = 0x00000080
CLONE_NEWNS: Final = 0x00020000
CLONE_NEWCGROUP: Final = 0x02000000
CLONE_NEWUTS: Final = 0x04000000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000
CLONE_NEW_MASK: Final = (
    CLONE_NEWTIME
    | CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)

AF_INET: Final = 2
AF_INET6: Final = 10
AF_NETLINK: Final = 16
AF_PACKET: Final = 17
SOCK_RAW: Final = 3
SOCK_PACKET: Final = 10
# The low bits of socket()'s type are the type proper; SOCK_NONBLOCK / SOCK_CLOEXEC sit above.
SOCK_TYPE_MASK: Final = 0xF

TIOCSTI: Final = 0x5412
TIOCLINUX: Final = 0x541C

PER_LINUX: Final = 0x0
PER_LINUX32: Final = 0x8
PERSONALITY_QUERY: Final = 0xFFFFFFFF

_ARG_RULES: Final[tuple[ArgRule, ...]] = (
    # clone without namespace bits is how threads, fork and posix_spawn work and must stay open.
    ArgRule(
        name="clone",
        reason="clone with a CLONE_NEW* flag creates namespaces, like unshare",
        when=(ArgCondition(arg=0, op="any_bit", values=(CLONE_NEW_MASK,)),),
    ),
    ArgRule(
        name="socket",
        reason="netlink and packet sockets reach kernel configuration and raw links",
        when=(ArgCondition(arg=0, op="in", values=(AF_NETLINK, AF_PACKET)),),
    ),
    ArgRule(
        name="socket",
        reason="raw IP sockets forge packets",
        when=(
            ArgCondition(arg=0, op="in", values=(AF_INET, AF_INET6)),
            ArgCondition(arg=1, op="in", values=(SOCK_RAW, SOCK_PACKET), mask=SOCK_TYPE_MASK),
        ),
    ),
    ArgRule(
        name="ioctl",
        reason="TIOCSTI and TIOCLINUX inject input into a terminal the sandbox may share",
        when=(ArgCondition(arg=1, op="in", values=(TIOCSTI, TIOCLINUX)),),
    ),
    ArgRule(
        name="personality",
        reason="personality flags such as ADDR_NO_RANDOMIZE weaken exploit mitigations",
        when=(
            ArgCondition(arg=0, op="not_in", values=(PER_LINUX, PER_LINUX32, PERSONALITY_QUERY)),
        ),
    ),
)

# Refused with ENOSYS rather than EPERM: glibc (2.34+) treats ENOSYS from clone3 as "old kernel"
# and falls back to clone, whose flags sit in a register the filter can read. clone3's flags are
# in a user-memory struct that seccomp cannot inspect.
_ENOSYS: Final[tuple[DeniedSyscall, ...]] = (
    _deny("clone3", "flags live in user memory seccomp cannot inspect; libc falls back to clone"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SeccompPolicy:
    """The rule table for one architecture. Build it with :func:`build_policy`."""

    arch: str
    denied: tuple[DeniedSyscall, ...]
    """Refused with EPERM whatever the arguments."""
    arg_rules: tuple[ArgRule, ...]
    """Refused with EPERM when their arguments match; allowed otherwise."""
    enosys: tuple[DeniedSyscall, ...]
    """Refused with ENOSYS, so that libc falls back to an older, filterable call."""

    def __post_init__(self) -> None:
        table = SYSCALL_NUMBERS.get(self.arch)
        if table is None:
            raise _unsupported(self.arch)
        seen: set[str] = set()
        for name in (*(d.name for d in self.denied), *(d.name for d in self.enosys)):
            if name not in table:
                raise ValueError(f"syscall {name} has no number on {self.arch}")
            if name in seen:
                raise ValueError(f"syscall {name} appears twice in the seccomp policy")
            seen.add(name)
        for rule in self.arg_rules:
            if rule.name not in table:
                raise ValueError(f"syscall {rule.name} has no number on {self.arch}")
            # An argument-filtered block ends in ALLOW, so the same call may not also be denied.
            if rule.name in seen:
                raise ValueError(f"syscall {rule.name} is both denied and argument-filtered")

    @property
    def audit_arch(self) -> int:
        """The AUDIT_ARCH_* value the kernel reports for this architecture's native ABI."""
        return AUDIT_ARCH[self.arch]

    @property
    def denied_count(self) -> int:
        """Syscalls refused outright (EPERM or ENOSYS)."""
        return len(self.denied) + len(self.enosys)

    @property
    def arg_filtered_names(self) -> tuple[str, ...]:
        """Syscalls refused only for some arguments, in rule order, without repeats."""
        return tuple(dict.fromkeys(r.name for r in self.arg_rules))

    def describe(self) -> str:
        """One line for the enforcement report, e.g. ``seccomp-bpf: 57 syscalls denied, ...``."""
        filtered = self.arg_filtered_names
        return (
            f"seccomp-bpf: {self.denied_count} syscalls denied, "
            f"{len(filtered)} argument-filtered ({', '.join(filtered)}), "
            f"foreign ABIs killed ({self.arch})"
        )

    def compile(self) -> bytes:
        """The classic-BPF program: the raw ``struct sock_filter`` array ``bwrap --seccomp`` reads.

        Native byte order. Every jump is short (a few instructions), so the program stays valid
        however long the tables grow, up to the kernel's 4096-instruction cap.
        """
        program = _assemble(_emit(self))
        if len(program) > BPF_MAXINSNS:
            raise ValueError(
                f"seccomp program has {len(program)} instructions, over {BPF_MAXINSNS}"
            )
        return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def build_policy(arch: str) -> SeccompPolicy:
    """The sandbox's seccomp rules for ``arch`` (``"x86_64"`` or ``"aarch64"``).

    Calls missing from the architecture (``iopl`` on aarch64...) are left out. Raises
    :class:`IsolationUnavailable` for any other architecture.
    """
    table = SYSCALL_NUMBERS.get(arch)
    if table is None:
        raise _unsupported(arch)
    return SeccompPolicy(
        arch=arch,
        denied=tuple(d for d in _DENIED if d.name in table),
        arg_rules=tuple(r for r in _ARG_RULES if r.name in table),
        enosys=tuple(d for d in _ENOSYS if d.name in table),
    )


# What the per-run setup of a warm start does after the template's fork, before the run's full
# filter goes on: new namespaces, its own mounts (tmpfs, /proc, inputs moved in from the host).
SETUP_ALLOWED: Final[tuple[str, ...]] = (
    "mount",
    "umount2",
    "unshare",
    "move_mount",
    "mount_setattr",
)


def build_setup_policy(arch: str) -> SeccompPolicy:
    """The looser filter of a warm-start template (see ``template.py``): :func:`build_policy`
    without :data:`SETUP_ALLOWED`. Every run forked from the template installs the full filter
    on top of it before any untrusted byte arrives; stacked filters all apply, so the run is held
    to the full one."""
    full = build_policy(arch)
    return SeccompPolicy(
        arch=arch,
        denied=tuple(d for d in full.denied if d.name not in SETUP_ALLOWED),
        arg_rules=full.arg_rules,
        enosys=full.enosys,
    )


# --- compiler ------------------------------------------------------------------------------------
# A tiny two-pass assembler: the emitter produces instructions whose jump targets are labels, the
# assembler turns them into the relative u8 offsets classic BPF uses. Labels always point forward
# (classic BPF cannot jump back) and every block is a few instructions long, which keeps each
# offset far below the 255 limit; the assembler still checks.


@dataclass(frozen=True, slots=True)
class _Label:
    name: str


@dataclass(frozen=True, slots=True)
class _Insn:
    code: int
    k: int = 0
    jt: _Label | None = None
    jf: _Label | None = None


_Item = _Insn | _Label


class _Emitter:
    def __init__(self) -> None:
        self.items: list[_Item] = []
        self._next = 0

    def label(self) -> _Label:
        self._next += 1
        return _Label(f"L{self._next}")

    def place(self, label: _Label) -> None:
        self.items.append(label)

    def insn(
        self, code: int, k: int = 0, jt: _Label | None = None, jf: _Label | None = None
    ) -> None:
        self.items.append(_Insn(code, k, jt, jf))

    def ret(self, value: int) -> None:
        self.insn(_RET_K, value)

    def load_nr(self) -> None:
        self.insn(_LD_W_ABS, _OFF_NR)

    def load_arg_low(self, index: int) -> None:
        # Both supported architectures are little-endian: the low word of args[i] comes first.
        self.insn(_LD_W_ABS, _OFF_ARGS + 8 * index)


def _emit(policy: SeccompPolicy) -> list[_Item]:
    numbers = SYSCALL_NUMBERS[policy.arch]
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    e = _Emitter()

    # A syscall made through another ABI (int 0x80 on x86_64, AArch32 on arm64) has other numbers;
    # evaluating it against this table would be meaningless, so the whole process dies.
    native = e.label()
    e.insn(_LD_W_ABS, _OFF_ARCH)
    e.insn(_JMP_JEQ_K, policy.audit_arch, jt=native)
    e.ret(SECCOMP_RET_KILL_PROCESS)
    e.place(native)

    e.load_nr()
    if policy.arch == "x86_64":
        # Unsigned compare: also catches nr == -1 and other out-of-range numbers.
        not_x32 = e.label()
        e.insn(_JMP_JGE_K, _X32_SYSCALL_BIT, jf=not_x32)
        e.ret(deny)
        e.place(not_x32)

    # Argument rules first. Each call's block ends in a RET on every path, so the accumulator
    # (which the block overwrites with arguments) never has to be reloaded with nr afterwards.
    # Only these blocks read arguments, which lets the kernel's seccomp action cache treat every
    # other syscall as "always allowed" without running the filter.
    by_name: dict[str, list[ArgRule]] = {}
    for rule in policy.arg_rules:
        by_name.setdefault(rule.name, []).append(rule)
    for name, rules in by_name.items():
        skip = e.label()
        e.insn(_JMP_JEQ_K, numbers[name], jf=skip)
        for rule in rules:
            _emit_arg_rule(e, rule, deny)
        e.ret(SECCOMP_RET_ALLOW)
        e.place(skip)

    # "JEQ nr, 0, 1; RET" pairs: only jumps of 0 or 1, so the table can grow without limit.
    for denied in policy.denied:
        _emit_nr_check(e, numbers[denied.name], deny)
    for refused in policy.enosys:
        _emit_nr_check(e, numbers[refused.name], SECCOMP_RET_ERRNO | errno.ENOSYS)

    e.ret(SECCOMP_RET_ALLOW)
    return e.items


def _emit_nr_check(e: _Emitter, nr: int, action: int) -> None:
    other = e.label()
    e.insn(_JMP_JEQ_K, nr, jf=other)
    e.ret(action)
    e.place(other)


def _emit_arg_rule(e: _Emitter, rule: ArgRule, deny: int) -> None:
    """Conditions in sequence; any failing one jumps past the rule's RET(deny) to the next rule."""
    no_match = e.label()
    for cond in rule.when:
        holds = e.label()
        e.load_arg_low(cond.arg)
        if cond.op == "any_bit":
            e.insn(_JMP_JSET_K, cond.values[0], jf=no_match)
        else:
            if cond.mask != _U32:
                e.insn(_ALU_AND_K, cond.mask)
            on_equal, otherwise = (holds, no_match) if cond.op == "in" else (no_match, holds)
            for i, value in enumerate(cond.values):
                last = i == len(cond.values) - 1
                e.insn(_JMP_JEQ_K, value, jt=on_equal, jf=otherwise if last else None)
        e.place(holds)
    e.ret(deny)
    e.place(no_match)


def _assemble(items: list[_Item]) -> list[tuple[int, int, int, int]]:
    """Resolve labels into relative offsets: (code, jt, jf, k) tuples."""
    positions: dict[_Label, int] = {}
    count = 0
    for item in items:
        if isinstance(item, _Label):
            positions[item] = count
        else:
            count += 1

    out: list[tuple[int, int, int, int]] = []
    for item in items:
        if isinstance(item, _Label):
            continue
        here = len(out)
        jt = _offset(positions, item.jt, here)
        jf = _offset(positions, item.jf, here)
        out.append((item.code, jt, jf, item.k & _U32))
    if not out or out[-1][0] != _RET_K:
        raise ValueError("a seccomp program must end with RET")
    return out


def _offset(positions: Mapping[_Label, int], target: _Label | None, here: int) -> int:
    if target is None:
        return 0
    delta = positions[target] - (here + 1)
    if not 0 <= delta <= 255:
        raise ValueError(f"BPF jump of {delta} from instruction {here} does not fit in u8")
    return delta
