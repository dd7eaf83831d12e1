"""The system calls sandboxed code may make: everything else is refused.

The list was derived from traces (``strace -f`` of every process inside the sandbox, cold and warm,
of representative Python, numpy, pandas, matplotlib, multiprocessing, asyncio, sqlite and bash
programs, and of the escape and session suites). The calls those traces saw are recorded in
``tests/unit/data/seccomp_trace.txt`` and the unit tests check that each is still allowed. Each
group below then adds the siblings of what the traces saw that libc or a package may pick instead
on another version or path (``stat``/``fstat``/``statx``, ``dup2``/``dup3``, ``poll``/``ppoll``,
the setters next to the getters), so that a program does not fail because its libc chose the other
spelling of the same operation.

Deliberately left out (refused with ENOSYS, so libc reports "not supported" or falls back):
Linux AIO (``io_setup``...), ``sync`` (flushes every filesystem of the host), ``vmsplice``,
``modify_ldt``, ``get_robust_list``, NUMA page migration (``migrate_pages``, ``move_pages``),
memory protection keys, ``ioprio_*``, ``process_madvise``/``process_mrelease`` (act on other
processes), ``memfd_secret``, and every call added to the kernel after this list was written
(``fchmodat2``, ``mseal``, ``cachestat``, ``statmount``/``listmount``...). Calls that would undo
another layer are refused by name with EPERM in :mod:`.rules`, whatever this list says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ALLOWED", "AllowedGroup"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AllowedGroup:
    """System calls allowed together, for one reason."""

    why: str
    names: tuple[str, ...]


def _group(why: str, names: str) -> AllowedGroup:
    return AllowedGroup(why=why, names=tuple(names.split()))


# Names missing from an architecture's table (the legacy x86_64 path calls on aarch64) are left
# out there by the policy; a name missing from every table is an error the policy reports.
ALLOWED: Final[tuple[AllowedGroup, ...]] = (
    _group(
        "memory: the allocator, the dynamic loader, numpy's buffers, OpenBLAS's NUMA queries",
        "brk mmap munmap mprotect mremap madvise msync mincore mlock mlock2 munlock mlockall "
        "munlockall membarrier mbind get_mempolicy set_mempolicy",
    ),
    _group(
        "threads: pthreads, locks, thread-local storage, restartable sequences",
        "futex futex_waitv set_robust_list rseq set_tid_address gettid sched_yield tgkill tkill "
        "arch_prctl",
    ),
    _group(
        "processes: fork/exec/wait (clone is argument-filtered in rules.py), limits, scheduling of "
        "the sandbox's own processes, pidfds, dropping capabilities, adding filters or Landlock "
        "rulesets of its own (both only ever narrow)",
        "clone fork vfork execve execveat exit exit_group wait4 waitid kill getpid getppid getpgid "
        "getpgrp getsid setsid setpgid prctl seccomp prlimit64 getrlimit setrlimit getrusage times "
        "getpriority setpriority sched_getaffinity sched_setaffinity sched_getparam "
        "sched_setparam sched_getscheduler sched_setscheduler sched_get_priority_max "
        "sched_get_priority_min sched_rr_get_interval sched_getattr sched_setattr pidfd_open "
        "pidfd_send_signal capget capset getcpu "
        "landlock_create_ruleset landlock_add_rule landlock_restrict_self",
    ),
    _group(
        "identity: the getters, and the setters a program tries before dropping privileges (the "
        "kernel refuses them itself: one uid mapped, no capabilities)",
        "getuid geteuid getgid getegid getresuid getresgid getgroups setuid setgid setreuid "
        "setregid setresuid setresgid setgroups setfsuid setfsgid",
    ),
    _group(
        "signals and timers",
        "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigpending "
        "rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack signalfd signalfd4 pause alarm setitimer "
        "getitimer timer_create timer_settime timer_gettime timer_getoverrun timer_delete "
        "restart_syscall clock_gettime clock_getres clock_nanosleep nanosleep gettimeofday time "
        "timerfd_create timerfd_settime timerfd_gettime",
    ),
    _group(
        "system information the sandbox may see (personality is argument-filtered in rules.py)",
        "uname sysinfo getrandom umask personality",
    ),
    _group(
        "file I/O on descriptors (ioctl is argument-filtered in rules.py)",
        "read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 lseek sendfile "
        "splice tee copy_file_range fadvise64 readahead fallocate ftruncate truncate fsync "
        "fdatasync syncfs sync_file_range flock open openat openat2 creat close close_range dup "
        "dup2 dup3 fcntl ioctl pipe pipe2 memfd_create eventfd eventfd2",
    ),
    _group(
        "paths: metadata, directories, links, permissions and owners (Landlock and the mount "
        "namespace decide where), extended attributes (shutil copies them), inotify",
        "stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2 getdents "
        "getdents64 getcwd chdir fchdir readlink readlinkat mkdir mkdirat rmdir rename renameat "
        "renameat2 link linkat unlink unlinkat symlink symlinkat mknod mknodat chmod fchmod "
        "fchmodat chown fchown lchown fchownat utime utimes utimensat futimesat getxattr "
        "lgetxattr fgetxattr listxattr llistxattr flistxattr setxattr lsetxattr fsetxattr "
        "removexattr lremovexattr fremovexattr inotify_init inotify_init1 inotify_add_watch "
        "inotify_rm_watch",
    ),
    _group(
        "waiting on descriptors: select, poll, epoll (asyncio, selectors, subprocess)",
        "select pselect6 poll ppoll epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait "
        "epoll_pwait2",
    ),
    _group(
        "System V and POSIX IPC, inside the sandbox's own IPC namespace (multiprocessing, "
        "shared memory)",
        "shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl "
        "mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr",
    ),
    _group(
        "sockets, inside the sandbox's own network namespace (socket is argument-filtered in "
        "rules.py; Landlock decides which ports)",
        "socket socketpair bind listen accept accept4 connect getsockname getpeername sendto "
        "recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown setsockopt getsockopt",
    ),
)
