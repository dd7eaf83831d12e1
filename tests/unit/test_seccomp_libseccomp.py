"""sandcell's compiled seccomp program against libseccomp's, decision by decision.

The same policy (allowlist, named refusals, argument rules) is handed to libseccomp, the compiler
Docker, systemd and most of the field use; both programs then run in the reference interpreter
over every system call number of the table and beyond, over foreign architectures, and over a grid
of arguments for each argument-filtered call. libseccomp resolves the names itself, so its tables
check ours too. Both architectures are compiled on any host (libseccomp builds foreign filters).
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Iterator

import pytest
from tests.unit.seccomp_ref import (
    LibSeccomp,
    LibseccompRule,
    load_libseccomp,
    run_bpf,
    seccomp_data,
)

from sandcell.backends.host.seccomp import (
    AUDIT_ARCH,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    SYSCALL_NUMBERS,
    ArgCondition,
    SeccompPolicy,
    build_policy,
    build_setup_policy,
)

ARCHES = ("x86_64", "aarch64")
EPERM = SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = SECCOMP_RET_ERRNO | errno.ENOSYS
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_ARM = 0x40000028
# Calls newer than the libseccomp this test may meet (2.5.4 in Debian 12): it cannot name them, so
# their decision is checked by the interpreter tests in test_seccomp.py only.
NEWER_THAN_LIBSECCOMP = {"open_tree_attr"}


@pytest.fixture(scope="module")
def lib() -> LibSeccomp:
    found = load_libseccomp()
    if found is None:
        pytest.skip("libseccomp is not installed (apt-get install libseccomp2)")
    return found


def _u32_nr(nr: int) -> int:
    return nr - (1 << 32) if nr >= 1 << 31 else nr


def _decide(program: bytes, arch: str, nr: int, args: tuple[int, ...] = ()) -> int:
    return run_bpf(program, seccomp_data(_u32_nr(nr), AUDIT_ARCH[arch], args))


def _main_rules(policy: SeccompPolicy, known: set[str]) -> list[LibseccompRule]:
    """Every call without argument tests; the default (ENOSYS) needs no rule."""
    filtered = set(policy.arg_filtered_names)
    rules = [LibseccompRule(n, SECCOMP_RET_ALLOW) for n in policy.allowed if n not in filtered]
    rules += [LibseccompRule(d.name, EPERM) for d in policy.denied]
    return [r for r in rules if r.name in known]


def _tests(cond: ArgCondition) -> list[tuple[int, int, int]]:
    """The condition as MASKED_EQ tests, any one of which makes it hold."""
    if cond.op == "any_bit":
        bits = [1 << i for i in range(32) if cond.values[0] >> i & 1]
        return [(cond.arg, bit, bit) for bit in bits]
    return [(cond.arg, cond.mask, value) for value in cond.values]


def _arg_filter(lib: LibSeccomp, policy: SeccompPolicy, name: str) -> bytes:
    """libseccomp's program for one argument-filtered call, other calls left to the default.

    A libseccomp rule is a conjunction of tests; an ``in`` or ``any_bit`` condition becomes one
    rule per value, a conjunction of them the cross product. A lone ``not_in`` condition becomes
    the opposite: EPERM by default, ALLOW for each listed value.
    """
    rules = [r for r in policy.arg_rules if r.name == name]
    if len(rules) == 1 and len(rules[0].when) == 1 and rules[0].when[0].op == "not_in":
        cond = rules[0].when[0]
        allow = [LibseccompRule(name, SECCOMP_RET_ALLOW, (t,)) for t in _tests(cond)]
        return lib.program(policy.arch, EPERM, allow)
    if any(c.op == "not_in" for r in rules for c in r.when):
        # A new shape of rule must fail the cross-check loudly, never be compared half-way.
        pytest.fail(f"{name}: the cross-check cannot translate this shape of argument rule yet")
    deny = [
        LibseccompRule(name, EPERM, combo)
        for rule in rules
        for combo in itertools.product(*(_tests(c) for c in rule.when))
    ]
    return lib.program(policy.arch, SECCOMP_RET_ALLOW, deny)


def _arg_grid(policy: SeccompPolicy, name: str) -> Iterator[tuple[int, ...]]:
    """Argument vectors around every value and bit the rules mention, with high-word garbage."""
    candidates: dict[int, set[int]] = {}
    for rule in policy.arg_rules:
        if rule.name != name:
            continue
        for cond in rule.when:
            seen = candidates.setdefault(cond.arg, {0, 1, 0xFFFFFFFF, 0x01200011, 0x003D0F00})
            for _, mask, value in _tests(cond):
                for v in (value, value | 0x80800, mask, value ^ 1, value ^ 0x100):
                    seen.update({v & 0xFFFFFFFF, (0xDEAD << 32) | v})
    positions = sorted(candidates)
    for values in itertools.product(*(sorted(candidates[p]) for p in positions)):
        args = [0] * (max(positions) + 1)
        for position, value in zip(positions, values, strict=True):
            args[position] = value
        yield tuple(args)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("setup", [False, True], ids=["full", "setup"])
def test_same_decision_as_libseccomp_for_every_number(
    lib: LibSeccomp, arch: str, setup: bool
) -> None:
    policy = build_setup_policy(arch) if setup else build_policy(arch)
    table = SYSCALL_NUMBERS[arch]
    named = {*policy.allowed, *(d.name for d in (*policy.denied, *policy.enosys))}
    known = {n for n in named if lib.number(arch, n) is not None}
    assert named - known <= NEWER_THAN_LIBSECCOMP, named - known
    ours = policy.compile()
    theirs = lib.program(arch, ENOSYS, _main_rules(policy, known))

    skipped = {table[n] for n in named - known} | {table[n] for n in policy.arg_filtered_names}
    numbers = [*range(max(table.values()) + 64), 0x3FFFFFFF, 0x7FFFFFFF, 0xFFFFFFFF]
    if arch == "x86_64":
        numbers += [0x40000000 + n for n in (0, 1, 2, 59, 165, 435, 547)]
    compared = 0
    for nr in numbers:
        if nr in skipped:
            continue
        for args in ((), (0xFFFFFFFF, 1, 2, 3, 4, 5), (0xDEAD << 32 | 0x10000000,)):
            assert _decide(ours, arch, nr, args) == _decide(theirs, arch, nr, args), (arch, nr)
        compared += 1
    assert compared > 400
    for foreign in {AUDIT_ARCH_I386, AUDIT_ARCH_ARM, *AUDIT_ARCH.values()} - {AUDIT_ARCH[arch]}:
        for nr in (0, 1, 56, 220, 435):
            mine = run_bpf(ours, seccomp_data(nr, foreign))
            assert mine == run_bpf(theirs, seccomp_data(nr, foreign)) == SECCOMP_RET_KILL_PROCESS


@pytest.mark.parametrize("arch", ARCHES)
def test_same_decision_as_libseccomp_for_argument_rules(lib: LibSeccomp, arch: str) -> None:
    policy = build_policy(arch)
    ours = policy.compile()
    assert set(policy.arg_filtered_names) == {"clone", "socket", "ioctl", "personality"}
    for name in policy.arg_filtered_names:
        theirs = _arg_filter(lib, policy, name)
        nr = SYSCALL_NUMBERS[arch][name]
        assert lib.number(arch, name) == nr
        verdicts = set()
        for args in _arg_grid(policy, name):
            mine = _decide(ours, arch, nr, args)
            assert mine == _decide(theirs, arch, nr, args), (arch, name, [hex(a) for a in args])
            verdicts.add(mine)
        # The grid reaches both sides of every rule.
        assert verdicts == {SECCOMP_RET_ALLOW, EPERM}, (name, verdicts)


@pytest.mark.parametrize("arch", ARCHES)
def test_number_tables_agree_with_libseccomp(lib: LibSeccomp, arch: str) -> None:
    checked = 0
    for name, nr in SYSCALL_NUMBERS[arch].items():
        if name in NEWER_THAN_LIBSECCOMP:
            continue
        assert lib.number(arch, name) == nr, (arch, name)
        checked += 1
    assert checked == len(SYSCALL_NUMBERS[arch]) - len(NEWER_THAN_LIBSECCOMP)
