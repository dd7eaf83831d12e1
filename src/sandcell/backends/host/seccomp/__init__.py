"""The seccomp-bpf filter applied to sandboxed code: an allowlist of the system calls it may make.

The namespaces backend hands the compiled program to bubblewrap (``bwrap --seccomp FD``), which
installs it right before it executes the sandbox's first program, so everything the code runs (and
every child it starts) inherits it and cannot remove it; a warm start's run process installs the
same program itself (``_zygote.py`` reads it from the template's control directory), on top of the
template's looser setup filter. The filter shrinks the kernel surface the code can reach to what
Python, bash and the runtime's packages use; a system call the kernel adds tomorrow is refused
until someone adds it here.

The package, one job per module:

``syscalls``
    the number tables (x86_64, aarch64) and the host's architecture;
``allowlist``
    the calls allowed, in groups with a reason each;
``rules``
    the calls refused by name (EPERM, with a reason each) and the argument rules;
``policy``
    all three put together for one architecture, checked and turned into the compiler's input;
``bpf``
    the classic-BPF compiler.

Everything is pure data until :meth:`SeccompPolicy.compile` returns the bytes, with no privileges,
libseccomp or kernel involved. The unit tests check the compiled program decision by decision
against what libseccomp compiles from the same policy.

Security limitations
--------------------
Argument filters only see register values, never memory behind pointers (which is why ``clone3``,
whose flags live in a struct, is refused as a whole). The allowed calls are still a large kernel
surface (file systems, sockets, futexes, memory management); the filter is defence in depth behind
the namespaces, dropped capabilities, resource limits and Landlock, and nothing in it is meant to
be the only thing standing between the code and the host.
"""

from __future__ import annotations

from sandcell.backends.host.seccomp.allowlist import ALLOWED, AllowedGroup
from sandcell.backends.host.seccomp.bpf import (
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    ArgCondition,
)
from sandcell.backends.host.seccomp.policy import (
    SETUP_ALLOWED,
    SeccompPolicy,
    build_policy,
    build_setup_policy,
)
from sandcell.backends.host.seccomp.rules import ArgRule, DeniedSyscall
from sandcell.backends.host.seccomp.syscalls import (
    AUDIT_ARCH,
    SUPPORTED_ARCHES,
    SYSCALL_NUMBERS,
    native_arch,
    syscall_number,
)

__all__ = [
    "ALLOWED",
    "AUDIT_ARCH",
    "SECCOMP_RET_ALLOW",
    "SECCOMP_RET_ERRNO",
    "SECCOMP_RET_KILL_PROCESS",
    "SETUP_ALLOWED",
    "SUPPORTED_ARCHES",
    "SYSCALL_NUMBERS",
    "AllowedGroup",
    "ArgCondition",
    "ArgRule",
    "DeniedSyscall",
    "SeccompPolicy",
    "build_policy",
    "build_setup_policy",
    "native_arch",
    "syscall_number",
]
