"""The classic-BPF compiler: a filter described as data in, the ``struct sock_filter`` array out.

It knows nothing of which calls are allowed or why (that is :mod:`.policy`); it turns a
:class:`FilterSpec` (an action per system call number, a default for every other number, and
argument tests for a few calls) into the bytes ``bwrap --seccomp FD`` and
``prctl(PR_SET_SECCOMP)`` read. No privileges, libseccomp or kernel are needed, and the output is
deterministic. Program shape::

    arch != native AUDIT_ARCH            -> KILL_PROCESS   (i386 / x32 / AArch32 entry points)
    x86_64, nr >= 0x40000000, nr != -1   -> KILL_PROCESS   (x32 shares x86_64's AUDIT_ARCH)
    nr == each argument-tested call      -> its tests, each block ending in a RET
    nr in ascending number ranges        -> the range's action (ALLOW, ERRNO(EPERM), ...)
    above the last range                 -> default

The range chain compares ``nr`` against each range's upper end in ascending order, so every jump
is of 0 or 1 instructions whatever the table's size. Only the argument blocks read arguments; for
every other number the result depends on ``nr`` and ``arch`` alone, which lets the kernel's seccomp
action cache (Linux 5.11+) answer "allow" without running the program at all.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "BPF_MAXINSNS",
    "SECCOMP_RET_ALLOW",
    "SECCOMP_RET_ERRNO",
    "SECCOMP_RET_KILL_PROCESS",
    "ArgBlock",
    "ArgCondition",
    "FilterSpec",
    "compile_filter",
]

SECCOMP_RET_KILL_PROCESS: Final = 0x80000000
SECCOMP_RET_ERRNO: Final = 0x00050000
SECCOMP_RET_ALLOW: Final = 0x7FFF0000

# The x32 ABI reuses AUDIT_ARCH_X86_64 and marks its syscall numbers with this bit, so the
# architecture check alone does not keep it out.
X32_SYSCALL_BIT: Final = 0x40000000

BPF_MAXINSNS: Final = 4096
"""The kernel refuses longer classic-BPF programs."""

# Classic-BPF opcodes (class | size | mode / class | op | src).
_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_ALU_AND_K: Final = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JMP_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JMP_JGE_K: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JMP_JSET_K: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K: Final = 0x06  # BPF_RET | BPF_K

# Offsets in struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}.
_OFF_NR: Final = 0
_OFF_ARCH: Final = 4
_OFF_ARGS: Final = 16

_U32: Final = 0xFFFFFFFF


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
class ArgBlock:
    """The argument tests of one call: ``on_match`` if any alternative's conditions all hold,
    ``otherwise`` if none does."""

    nr: int
    alternatives: tuple[tuple[ArgCondition, ...], ...]
    on_match: int
    otherwise: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterSpec:
    """Everything the compiler needs; :mod:`.policy` builds it from the rule tables."""

    audit_arch: int
    kill_x32: bool
    """Kill on x86_64's x32 numbers (``nr >= 0x40000000``), as on any other foreign ABI."""
    arg_blocks: tuple[ArgBlock, ...]
    actions: Mapping[int, int]
    """System call number to action, for numbers without argument tests."""
    default: int
    """The action for every number neither table mentions."""

    def __post_init__(self) -> None:
        blocked = [b.nr for b in self.arg_blocks]
        if len(set(blocked)) != len(blocked):
            raise ValueError("two argument blocks for the same system call number")
        if clash := set(blocked) & set(self.actions):
            raise ValueError(f"numbers {sorted(clash)} have both an action and argument tests")
        for nr in (*blocked, *self.actions):
            if not 0 <= nr < X32_SYSCALL_BIT:
                raise ValueError(f"system call number {nr} is out of range")


def compile_filter(spec: FilterSpec) -> bytes:
    """The program for ``spec`` in native byte order, checked against the kernel's size cap."""
    program = _assemble(_emit(spec))
    if len(program) > BPF_MAXINSNS:
        raise ValueError(f"seccomp program has {len(program)} instructions, over {BPF_MAXINSNS}")
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def _ranges(spec: FilterSpec) -> list[tuple[int, int]]:
    """(last number, action) pairs covering 0..2**32-1 in ascending order, neighbours merged.

    Numbers with argument blocks never reach the chain, so they join whichever range is next to
    them rather than cutting one in two.
    """
    skip = {b.nr for b in spec.arg_blocks}
    top = max((*spec.actions, *skip), default=-1)
    out: list[tuple[int, int]] = []
    for nr in range(top + 1):
        if nr in skip:
            continue
        action = spec.actions.get(nr, spec.default)
        if out and out[-1][1] == action:
            out[-1] = (nr, action)
        else:
            if out:
                # Whatever was skipped since the previous range joins it.
                out[-1] = (nr - 1, out[-1][1])
            out.append((nr, action))
    if out and out[-1][1] == spec.default:
        out.pop()
    out.append((_U32, spec.default))
    return out


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

    def load_arg_low(self, index: int) -> None:
        # Both supported architectures are little-endian: the low word of args[i] comes first.
        self.insn(_LD_W_ABS, _OFF_ARGS + 8 * index)


def _emit(spec: FilterSpec) -> list[_Item]:
    e = _Emitter()

    # A syscall made through another ABI (int 0x80 on x86_64, AArch32 on arm64) has other numbers;
    # evaluating it against this table would be meaningless, so the whole process dies.
    native = e.label()
    e.insn(_LD_W_ABS, _OFF_ARCH)
    e.insn(_JMP_JEQ_K, spec.audit_arch, jt=native)
    e.ret(SECCOMP_RET_KILL_PROCESS)
    e.place(native)

    e.insn(_LD_W_ABS, _OFF_NR)
    if spec.kill_x32:
        # nr == -1 is no x32 call (a tracer sets it to skip a call); like libseccomp, it goes on
        # to the default action.
        not_x32 = e.label()
        e.insn(_JMP_JGE_K, X32_SYSCALL_BIT, jf=not_x32)
        e.insn(_JMP_JEQ_K, _U32, jt=not_x32)
        e.ret(SECCOMP_RET_KILL_PROCESS)
        e.place(not_x32)

    # Each block ends in a RET on every path, so the accumulator (which the block overwrites with
    # arguments) never has to be reloaded with nr afterwards.
    for block in spec.arg_blocks:
        skip = e.label()
        e.insn(_JMP_JEQ_K, block.nr, jf=skip)
        for conditions in block.alternatives:
            _emit_alternative(e, conditions, block.on_match)
        e.ret(block.otherwise)
        e.place(skip)

    ranges = _ranges(spec)
    for last, action in ranges[:-1]:
        above = e.label()
        e.insn(_JMP_JGE_K, last + 1, jt=above)
        e.ret(action)
        e.place(above)
    e.ret(ranges[-1][1])
    return e.items


def _emit_alternative(e: _Emitter, conditions: tuple[ArgCondition, ...], action: int) -> None:
    """Conditions in sequence; any failing one jumps past the RET(action) to what follows."""
    no_match = e.label()
    for cond in conditions:
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
    e.ret(action)
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
