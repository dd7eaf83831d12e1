"""The seccomp policy and its compiled program, checked with a small classic-BPF interpreter.

No kernel involved: the compiled bytes are run against synthetic ``struct seccomp_data`` values,
for both architectures, whatever the host. ``test_seccomp_libseccomp.py`` compares the same
programs with libseccomp's.
"""

from __future__ import annotations

import errno
import functools
import platform
import re
from pathlib import Path

import pytest
from tests.unit.seccomp_ref import decode, run_bpf, seccomp_data

from sandcell.backends.host import seccomp
from sandcell.backends.host.seccomp import (
    ALLOWED,
    AUDIT_ARCH,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    SETUP_ALLOWED,
    SYSCALL_NUMBERS,
    SeccompPolicy,
    build_policy,
    build_setup_policy,
    native_arch,
)
from sandcell.errors import IsolationUnavailable

ARCHES = ("x86_64", "aarch64")
EPERM = SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = SECCOMP_RET_ERRNO | errno.ENOSYS

AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_ARM = 0x40000028

# Ordinary calls, written out here rather than taken from the module so that a wrong number in
# the module's table cannot make these tests agree with it.
ORDINARY = {
    "x86_64": {
        "read": 0, "write": 1, "openat": 257, "mmap": 9, "execve": 59, "exit_group": 231,
        "socketpair": 53, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "read": 63, "write": 64, "openat": 56, "mmap": 222, "execve": 221, "exit_group": 94,
        "socketpair": 199, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}  # fmt: skip
KNOWN = {
    "x86_64": {"clone": 56, "clone3": 435, "socket": 41, "ioctl": 16, "personality": 135,
               "mount": 165, "ptrace": 101, "unshare": 272, "bpf": 321},
    "aarch64": {"clone": 220, "clone3": 435, "socket": 198, "ioctl": 29, "personality": 92,
                "mount": 40, "ptrace": 117, "unshare": 97, "bpf": 280},
}  # fmt: skip

CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# What glibc passes for fork() and pthread_create().
FORK_FLAGS = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
THREAD_FLAGS = 0x003D0F00  # CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | *TID


def verdict(
    policy: SeccompPolicy, name_or_nr: str | int, *args: int, arch: int | None = None
) -> int:
    if isinstance(name_or_nr, str):
        known = {**ORDINARY[policy.arch], **SYSCALL_NUMBERS[policy.arch]}
        nr = known[name_or_nr]
    else:
        nr = name_or_nr
    audit = AUDIT_ARCH[policy.arch] if arch is None else arch
    return run_bpf(_compiled(policy), seccomp_data(nr, audit, args))


@functools.cache
def _compiled(policy: SeccompPolicy) -> bytes:
    return policy.compile()


@pytest.fixture(params=ARCHES)
def policy(request: pytest.FixtureRequest) -> SeccompPolicy:
    return build_policy(request.param)


# --- the program ---------------------------------------------------------------------------------


def test_program_is_well_formed(policy: SeccompPolicy) -> None:
    program = policy.compile()
    insns = decode(program)
    assert 0 < len(insns) < 4096
    assert insns[-1][0] == 0x06, "the kernel requires a final RET"
    for pc, (code, jt, jf, k) in enumerate(insns):
        if code & 0x07 == 0x05:  # BPF_JMP
            target = pc + 1 + (k if code == 0x05 else max(jt, jf))
            assert target < len(insns)
    assert program == policy.compile(), "compilation is deterministic"


@pytest.mark.parametrize("arch", ARCHES)
def test_every_denied_syscall_is_eperm(arch: str) -> None:
    policy = build_policy(arch)
    assert policy.denied
    for denied in policy.denied:
        assert denied.reason
        assert verdict(policy, denied.name) == EPERM, denied.name
        # Whatever the arguments.
        assert verdict(policy, denied.name, 0xFFFFFFFF, 1, 2, 3, 4, 5) == EPERM, denied.name


def test_denied_table_contents() -> None:
    common = {
        "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
        "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv",
        "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "userfaultfd", "perf_event_open",
        "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
        "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module",
        "delete_module", "unshare", "setns", "open_by_handle_at", "name_to_handle_at", "acct",
        "swapon", "swapoff", "reboot", "syslog", "quotactl", "settimeofday", "clock_settime",
        "clock_adjtime", "adjtimex", "vhangup", "fanotify_init", "sethostname", "setdomainname",
    }  # fmt: skip
    x86_only = {"iopl", "ioperm", "uselib", "lookup_dcookie"}
    x86 = {d.name for d in build_policy("x86_64").denied}
    arm = {d.name for d in build_policy("aarch64").denied}
    assert common | x86_only <= x86
    assert common <= arm
    assert not {"iopl", "ioperm", "uselib"} & arm
    assert not any(name.startswith("landlock") for name in x86 | arm)


def test_ordinary_syscalls_are_allowed(policy: SeccompPolicy) -> None:
    for name in ORDINARY[policy.arch]:
        assert verdict(policy, name, 3, 0, 0) == SECCOMP_RET_ALLOW, name


def test_clone_without_namespace_flags_is_allowed(policy: SeccompPolicy) -> None:
    for flags in (0, FORK_FLAGS, THREAD_FLAGS, 0x11):  # 0x11: SIGCHLD
        assert verdict(policy, "clone", flags) == SECCOMP_RET_ALLOW, hex(flags)


@pytest.mark.parametrize("flag", sorted(CLONE_NEW_FLAGS))
def test_clone_with_namespace_flag_is_eperm(policy: SeccompPolicy, flag: str) -> None:
    bit = CLONE_NEW_FLAGS[flag]
    assert verdict(policy, "clone", bit) == EPERM
    assert verdict(policy, "clone", FORK_FLAGS | bit) == EPERM
    # Only the low word counts (the kernel truncates clone's flags); high garbage changes nothing.
    assert verdict(policy, "clone", (0xDEAD << 32) | bit) == EPERM
    assert verdict(policy, "clone", (0xFFFFFFFF << 32) | FORK_FLAGS) == SECCOMP_RET_ALLOW


def test_clone3_is_enosys(policy: SeccompPolicy) -> None:
    assert verdict(policy, "clone3") == ENOSYS
    assert verdict(policy, "clone3", 0x1234, 88) == ENOSYS


def test_socket(policy: SeccompPolicy) -> None:
    af_unix, af_inet, af_inet6, af_netlink, af_packet = 1, 2, 10, 16, 17
    sock_stream, sock_dgram, sock_raw, sock_packet = 1, 2, 3, 10
    nonblock_cloexec = 0o4000 | 0o2000000
    allowed = [
        (af_unix, sock_stream),
        (af_unix, sock_dgram),
        (af_inet, sock_stream),
        (af_inet, sock_dgram),
        (af_inet6, sock_stream | nonblock_cloexec),
        (af_unix, sock_raw),  # SOCK_RAW only matters for IP
    ]
    denied = [
        (af_netlink, sock_raw),
        (af_netlink, sock_dgram),
        (af_packet, sock_raw),
        (af_packet, sock_dgram),
        (af_inet, sock_raw),
        (af_inet6, sock_raw),
        (af_inet, sock_raw | nonblock_cloexec),
        (af_inet6, sock_raw | nonblock_cloexec),
        (af_inet, sock_packet),
    ]
    for domain, kind in allowed:
        assert verdict(policy, "socket", domain, kind, 0) == SECCOMP_RET_ALLOW, (domain, kind)
    for domain, kind in denied:
        assert verdict(policy, "socket", domain, kind, 0) == EPERM, (domain, kind)
    for kind in (sock_stream, sock_dgram):
        assert verdict(policy, ORDINARY[policy.arch]["socketpair"], af_unix, kind) == (
            SECCOMP_RET_ALLOW
        )


def test_ioctl(policy: SeccompPolicy) -> None:
    for request in (0x5412, 0x541C):  # TIOCSTI, TIOCLINUX
        assert verdict(policy, "ioctl", 0, request) == EPERM
        assert verdict(policy, "ioctl", 0, (1 << 32) | request) == EPERM
    for request in (0x5401, 0x5413, 0x541B, 0x5421, 0x80045430):  # TCGETS, TIOCGWINSZ, ...
        assert verdict(policy, "ioctl", 1, request) == SECCOMP_RET_ALLOW, hex(request)


def test_personality(policy: SeccompPolicy) -> None:
    for persona in (0x0, 0x8, 0xFFFFFFFF):
        assert verdict(policy, "personality", persona) == SECCOMP_RET_ALLOW, hex(persona)
    for persona in (0x0040000, 0x0400000, 0x0008 | 0x0040000, 0x1, 0x00200000):
        assert verdict(policy, "personality", persona) == EPERM, hex(persona)


def test_wrong_arch_is_killed(policy: SeccompPolicy) -> None:
    foreign = {AUDIT_ARCH_I386, AUDIT_ARCH_ARM, 0, *AUDIT_ARCH.values()} - {policy.audit_arch}
    assert len(foreign) == 4
    for arch in foreign:
        for nr in (0, 1, 56, 220, 435):
            assert verdict(policy, nr, arch=arch) == SECCOMP_RET_KILL_PROCESS, (hex(arch), nr)


def test_x32_abi_is_killed() -> None:
    policy = build_policy("x86_64")
    x32 = 0x40000000
    for nr in (x32 + 0, x32 + 1, x32 + 59, x32 + 165, x32 + 547, 0x7FFFFFFF):
        assert verdict(policy, nr) == SECCOMP_RET_KILL_PROCESS, hex(nr)
    # -1 is no x32 call (a tracer's "skip this call"): the default, as libseccomp does.
    assert verdict(policy, -1) == ENOSYS


def test_aarch64_has_no_x32_special_case() -> None:
    # Large numbers are simply not in the allowlist on aarch64.
    assert verdict(build_policy("aarch64"), 0x40000000) == ENOSYS


# --- the allowlist -------------------------------------------------------------------------------

# Calls the allowlist leaves out on purpose, and calls newer than it (numbers written out here).
UNLISTED = {
    "x86_64": {"io_setup": 206, "sync": 162, "vmsplice": 278, "modify_ldt": 154,
               "migrate_pages": 256, "pkey_alloc": 330, "process_madvise": 440,
               "memfd_secret": 447, "fchmodat2": 452, "mseal": 462, "listmount": 458},
    "aarch64": {"io_setup": 0, "sync": 81, "vmsplice": 75, "migrate_pages": 238,
                "pkey_alloc": 289, "process_madvise": 440, "memfd_secret": 447,
                "fchmodat2": 452, "mseal": 462, "listmount": 458},
}  # fmt: skip


def test_unlisted_calls_are_enosys(policy: SeccompPolicy) -> None:
    for name, nr in UNLISTED[policy.arch].items():
        assert name not in SYSCALL_NUMBERS[policy.arch] or name not in policy.allowed, name
        assert verdict(policy, nr) == ENOSYS, name
        assert verdict(policy, nr, 0xFFFFFFFF, 1, 2) == ENOSYS, name
    top = max(SYSCALL_NUMBERS[policy.arch].values())
    for nr in (top + 1, top + 100, 1000, 0x3FFFFFFF):
        assert verdict(policy, nr) == ENOSYS, nr


def test_every_allowlisted_call_is_allowed_whatever_its_arguments(policy: SeccompPolicy) -> None:
    filtered = set(policy.arg_filtered_names)
    assert len(policy.allowed) > 200
    for name in policy.allowed:
        if name in filtered:
            continue
        for args in ((), (0xFFFFFFFF, 0x10000000, 0x5412, 3, 4, 5)):
            assert verdict(policy, name, *args) == SECCOMP_RET_ALLOW, name


def test_allowlist_and_refusals_are_disjoint() -> None:
    names = [n for group in ALLOWED for n in group.names]
    assert len(names) == len(set(names)), "a call is listed twice"
    assert all(group.why for group in ALLOWED)
    for arch in ARCHES:
        policy = build_policy(arch)
        refused = {d.name for d in (*policy.denied, *policy.enosys)}
        assert not refused & set(policy.allowed)
        assert set(policy.arg_filtered_names) <= set(policy.allowed)


def test_aarch64_has_no_legacy_calls() -> None:
    arm = set(build_policy("aarch64").allowed)
    for name in ("open", "stat", "fork", "pipe", "poll", "rename", "dup2", "arch_prctl"):
        assert name in build_policy("x86_64").allowed
        assert name not in arm
    for name in ("openat", "newfstatat", "renameat", "renameat2", "dup3", "ppoll", "pipe2"):
        assert name in arm


TRACE = Path(__file__).parent / "data" / "seccomp_trace.txt"


def _traced() -> dict[str, set[str]]:
    """Filter level ("full" or "setup") to the calls the recorded traces saw under it."""
    seen: dict[str, set[str]] = {}
    for line in TRACE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            level, names = line.split(":", 1)
            seen.setdefault(level.strip(), set()).update(names.split())
    return seen


def test_every_traced_call_is_allowed_or_deliberately_refused() -> None:
    """Each call seen in the traces (x86_64) gets the decision the program needs.

    A traced call that is refused must be one the program survives: clone3, which libc retries as
    clone.
    """
    traced = _traced()
    assert len(traced["full"]) > 100 and len(traced["setup"]) > 40
    expected_refusals = {"clone3"}
    for level, policy in (
        ("full", build_policy("x86_64")),
        ("setup", build_setup_policy("x86_64")),
    ):
        for name in traced[level]:
            nr = SYSCALL_NUMBERS["x86_64"].get(name)
            assert nr is not None, f"traced call {name} has no number: add it to the allowlist"
            if name in expected_refusals:
                assert verdict(policy, name) == ENOSYS
            else:
                assert name in policy.allowed, (level, name)
    assert set(SETUP_ALLOWED) & traced["setup"], "the setup traces show the template's own mounts"
    # What the escape suite tried on purpose stays refused by name.
    assert len(traced["attacks"]) > 20
    for name in traced["attacks"]:
        assert verdict(build_policy("x86_64"), name) == EPERM, name


# --- the tables ----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_known_numbers(arch: str) -> None:
    table = SYSCALL_NUMBERS[arch]
    for name, nr in KNOWN[arch].items():
        assert table[name] == nr, name
    assert len(set(table.values())) == len(table), "two names share a number"


def _header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\s*$", text, re.M)}
    # The generic table defines the calls whose 32- and 64-bit forms differ as __NR3264_*; the
    # 64-bit ABI spells fstatat as newfstatat and the rest as they are.
    for m in re.finditer(r"#define __NR3264_(\w+)\s+(\d+)\s*$", text, re.M):
        numbers.setdefault("newfstatat" if m[1] == "fstatat" else m[1], int(m[2]))
    return numbers


@pytest.mark.parametrize(
    ("arch", "candidates"),
    [
        (
            "x86_64",
            (
                "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
                "/usr/include/asm/unistd_64.h",
            ),
        ),
        ("aarch64", ("/usr/include/asm-generic/unistd.h",)),
    ],
)
def test_numbers_match_installed_kernel_headers(arch: str, candidates: tuple[str, ...]) -> None:
    header = next((Path(c) for c in candidates if Path(c).is_file()), None)
    if header is None:
        pytest.skip(f"no kernel headers for {arch} installed")
    numbers = _header_numbers(header)
    checked = 0
    for name, nr in SYSCALL_NUMBERS[arch].items():
        if name in numbers:  # older headers lack the newest calls
            assert numbers[name] == nr, (arch, name)
            checked += 1
    assert checked >= len(SYSCALL_NUMBERS[arch]) - 5


def test_policy_rejects_inconsistent_tables() -> None:
    base = build_policy("x86_64")
    with pytest.raises(ValueError, match="clone appears twice"):
        SeccompPolicy(
            arch="x86_64",
            allowed=base.allowed,
            denied=(*base.denied, seccomp.DeniedSyscall(name="clone", reason="x")),
            arg_rules=base.arg_rules,
            enosys=base.enosys,
        )
    with pytest.raises(ValueError, match="appears twice"):
        SeccompPolicy(
            arch="x86_64",
            allowed=(*base.allowed, "mount"),
            denied=base.denied,
            arg_rules=base.arg_rules,
            enosys=base.enosys,
        )
    with pytest.raises(ValueError, match="not allowlisted"):
        SeccompPolicy(
            arch="x86_64",
            allowed=tuple(n for n in base.allowed if n != "socket"),
            denied=base.denied,
            arg_rules=base.arg_rules,
            enosys=base.enosys,
        )
    with pytest.raises(ValueError, match="no number"):
        SeccompPolicy(
            arch="aarch64",
            allowed=(),
            denied=(seccomp.DeniedSyscall(name="iopl", reason="x"),),
            arg_rules=(),
            enosys=(),
        )
    with pytest.raises(ValueError, match="no number"):
        SeccompPolicy(arch="aarch64", allowed=("open",), denied=(), arg_rules=(), enosys=())
    with pytest.raises(ValueError):
        seccomp.ArgCondition(arg=6, op="in", values=(1,))
    with pytest.raises(ValueError):
        seccomp.ArgCondition(arg=0, op="in", values=(1 << 32,))


def test_program_size_follows_ranges_not_calls() -> None:
    """The range chain costs two instructions per run of equal decisions, far below the cap; a
    condition too wide for a short jump is refused at compile time, never emitted wrong."""
    for arch in ARCHES:
        assert len(decode(build_policy(arch).compile())) < 400
    base = build_policy("x86_64")
    wide = seccomp.ArgRule(
        name="personality",
        reason="many values",
        when=(seccomp.ArgCondition(arg=0, op="not_in", values=tuple(range(300))),),
    )
    policy = SeccompPolicy(
        arch="x86_64", allowed=base.allowed, denied=(), arg_rules=(wide,), enosys=()
    )
    with pytest.raises(ValueError, match="does not fit in u8"):
        policy.compile()


def test_describe(policy: SeccompPolicy) -> None:
    text = policy.describe()
    assert text.startswith(f"seccomp-bpf allowlist: {len(policy.allowed)} syscalls allowed")
    assert "clone" in text and "socket" in text and "ENOSYS" in text


def test_setup_policy_differs_only_by_the_setup_calls(policy: SeccompPolicy) -> None:
    setup = build_setup_policy(policy.arch)
    assert set(setup.allowed) - set(policy.allowed) == set(SETUP_ALLOWED)
    for name in SETUP_ALLOWED:
        assert verdict(policy, name) == EPERM
        assert verdict(setup, name) == SECCOMP_RET_ALLOW
    for name in ("ptrace", "bpf", "pivot_root", "setns", "clone3"):
        assert verdict(setup, name) == verdict(policy, name) != SECCOMP_RET_ALLOW


# --- architecture detection ----------------------------------------------------------------------


def test_native_arch_on_this_host() -> None:
    if platform.machine() not in ARCHES:
        pytest.skip("unsupported host")
    assert native_arch() == platform.machine()


@pytest.mark.parametrize("machine", ["riscv64", "ppc64le", "i686", "armv7l", "s390x", ""])
def test_unknown_arch_raises(monkeypatch: pytest.MonkeyPatch, machine: str) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    with pytest.raises(IsolationUnavailable) as info:
        native_arch()
    assert info.value.layer == "seccomp"
    assert info.value.fix
    with pytest.raises(IsolationUnavailable):
        build_policy(machine or "unknown")
