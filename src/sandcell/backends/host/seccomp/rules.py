"""The named refusals of the seccomp policy: calls refused whatever their arguments, and calls
refused only for some arguments.

Everything outside the allowlist (:mod:`.allowlist`) is refused anyway; the calls named here are
the ones that would undo another isolation layer or open a kernel subsystem with a long record of
privilege-escalation bugs. Naming them gives them EPERM (what the escape tests and most programs
expect from "not permitted"), a reason each, and a guarantee the tests check: no allowlist change
can let one of them through. The argument rules keep a handful of everyday calls open (clone,
socket, ioctl, personality) while refusing their dangerous forms; seccomp sees only register
values, never memory behind pointers, which is why clone3 (flags in a struct) is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sandcell.backends.host.seccomp.bpf import ArgCondition

__all__ = [
    "ARG_RULES",
    "DENIED",
    "ENOSYS_REFUSED",
    "ArgRule",
    "DeniedSyscall",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeniedSyscall:
    """A system call the policy names and refuses outright, whatever its arguments.

    Refusing a call by name (rather than leaving it to the allowlist's default) picks its errno
    and records why it must stay refused even if someone widens the allowlist.
    """

    name: str
    reason: str
    """One line: why sandboxed code has no business making this call."""


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
DENIED: Final[tuple[DeniedSyscall, ...]] = (
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

ARG_RULES: Final[tuple[ArgRule, ...]] = (
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
ENOSYS_REFUSED: Final[tuple[DeniedSyscall, ...]] = (
    _deny("clone3", "flags live in user memory seccomp cannot inspect; libc falls back to clone"),
)
