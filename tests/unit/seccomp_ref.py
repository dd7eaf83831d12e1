"""Reference tools for the seccomp tests: a classic-BPF interpreter, and libseccomp through ctypes.

The interpreter runs any program the kernel's seccomp verifier accepts over synthetic
``struct seccomp_data`` values (libseccomp's output uses more of classic BPF than sandcell's
compiler does: scratch memory, the X register, ALU ops). :func:`libseccomp_program` compiles a
filter with the field's own compiler (``seccomp_init`` / ``seccomp_rule_add_array`` /
``seccomp_export_bpf``), so the tests can compare the two programs decision by decision. The
Python binding for libseccomp lives in Debian's system dist-packages, which a virtual environment
does not see; ctypes reaches the same C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BpfError",
    "LibSeccomp",
    "LibseccompRule",
    "decode",
    "load_libseccomp",
    "run_bpf",
    "seccomp_data",
]

_U32 = 0xFFFFFFFF


class BpfError(Exception):
    pass


def decode(program: bytes) -> list[tuple[int, int, int, int]]:
    assert len(program) % 8 == 0, "a sock_filter array is a multiple of 8 bytes"
    return [struct.unpack_from("=HBBI", program, off) for off in range(0, len(program), 8)]


def seccomp_data(nr: int, arch: int, args: Sequence[int] = (), ip: int = 0) -> bytes:
    full = (*args, *(0,) * (6 - len(args)))
    return struct.pack("=iIQ6Q", nr, arch, ip, *full)


_ALU = {
    0x00: lambda a, b: a + b,
    0x10: lambda a, b: a - b,
    0x20: lambda a, b: a * b,
    0x30: lambda a, b: a // b,
    0x40: lambda a, b: a | b,
    0x50: lambda a, b: a & b,
    0x60: lambda a, b: a << b,
    0x70: lambda a, b: a >> b,
    0x90: lambda a, b: a % b,
    0xA0: lambda a, b: a ^ b,
}
_JMP = {
    0x10: lambda a, b: a == b,
    0x20: lambda a, b: a > b,
    0x30: lambda a, b: a >= b,
    0x40: lambda a, b: (a & b) != 0,
}


def run_bpf(program: bytes, data: bytes) -> int:
    """The program's return value for ``data``; strict about what the verifier would reject."""
    insns = decode(program)
    a = x = 0
    mem = [0] * 16
    pc = 0
    steps = 0
    while True:
        if not 0 <= pc < len(insns):
            raise BpfError(f"pc {pc} fell off the program")
        steps += 1
        assert steps <= len(insns), "classic BPF only jumps forward"
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if code == 0x20:  # LD W ABS
            if k % 4 or k + 4 > len(data):
                raise BpfError(f"bad load offset {k}")
            (a,) = struct.unpack_from("=I", data, k)
        elif code == 0x00:  # LD IMM
            a = k
        elif code == 0x01:  # LDX IMM
            x = k
        elif code == 0x60:  # LD MEM
            a = mem[k]
        elif code == 0x61:  # LDX MEM
            x = mem[k]
        elif code == 0x02:  # ST
            mem[k] = a
        elif code == 0x03:  # STX
            mem[k] = x
        elif cls == 0x04 and code & 0xF0 in _ALU:  # ALU K / X
            operand = x if code & 0x08 else k
            a = _ALU[code & 0xF0](a, operand) & _U32
        elif code == 0x84:  # NEG
            a = -a & _U32
        elif code == 0x05:  # JA
            pc += k
        elif cls == 0x05 and code & 0xF0 in _JMP:  # JEQ/JGT/JGE/JSET, K or X
            operand = x if code & 0x08 else k
            pc += jt if _JMP[code & 0xF0](a, operand) else jf
        elif code == 0x07:  # TAX
            x = a
        elif code == 0x87:  # TXA
            a = x
        elif code == 0x06:  # RET K
            return k
        elif code == 0x16:  # RET A
            return a
        else:
            raise BpfError(f"opcode {code:#x} not supported")


# --- libseccomp ----------------------------------------------------------------------------------

SCMP_FLTATR_ACT_BADARCH = 2
SCMP_ARCH_NATIVE = 0
SCMP_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@dataclass(frozen=True, slots=True)
class LibseccompRule:
    """One ``seccomp_rule_add_array`` call: ``(arg, mask, value)`` tests, all MASKED_EQ."""

    name: str
    action: int
    masked_eq: tuple[tuple[int, int, int], ...] = ()


class LibSeccomp:
    """The parts of libseccomp's C API the cross-check needs."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.seccomp_arch_remove.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.seccomp_arch_native.restype = ctypes.c_uint32
        lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
        lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]

    def arch_token(self, arch: str) -> int:
        token = int(self._lib.seccomp_arch_resolve_name(arch.encode()))
        if token == 0:
            raise ValueError(f"libseccomp does not know architecture {arch}")
        return token

    def number(self, arch: str, name: str) -> int | None:
        """libseccomp's own number for ``name`` on ``arch``, or None when it has none."""
        nr = int(self._lib.seccomp_syscall_resolve_name_arch(self.arch_token(arch), name.encode()))
        return nr if nr >= 0 else None

    def program(self, arch: str, default: int, rules: Sequence[LibseccompRule]) -> bytes:
        """libseccomp's program for ``arch`` only, foreign architectures killed."""
        lib = self._lib
        ctx = lib.seccomp_init(default)
        if not ctx:
            raise OSError("seccomp_init failed")
        try:
            self._check(lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, 0x80000000), "attr")
            token = self.arch_token(arch)
            if token != int(lib.seccomp_arch_native()):
                self._check(lib.seccomp_arch_add(ctx, token), f"arch_add {arch}")
                self._check(lib.seccomp_arch_remove(ctx, SCMP_ARCH_NATIVE), "arch_remove")
            for rule in rules:
                # Numbers are given in the native numbering; libseccomp translates them by name
                # into each architecture of the filter.
                nr = int(lib.seccomp_syscall_resolve_name(rule.name.encode()))
                cmps = (_ArgCmp * max(1, len(rule.masked_eq)))(
                    *(_ArgCmp(arg, SCMP_CMP_MASKED_EQ, mask, value) for arg, mask, value in
                      rule.masked_eq)
                )  # fmt: skip
                rc = lib.seccomp_rule_add_array(ctx, rule.action, nr, len(rule.masked_eq), cmps)
                self._check(rc, f"rule_add {rule.name}")
            fd = os.memfd_create("libseccomp-bpf", os.MFD_CLOEXEC)
            try:
                self._check(lib.seccomp_export_bpf(ctx, fd), "export_bpf")
                size = os.fstat(fd).st_size
                return os.pread(fd, size, 0)
            finally:
                os.close(fd)
        finally:
            lib.seccomp_release(ctx)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc < 0:
            raise OSError(-rc, f"libseccomp {what}: {os.strerror(-rc)}")


def load_libseccomp() -> LibSeccomp | None:
    """libseccomp 2 through ctypes, or None where the library is not installed."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    return LibSeccomp(lib)
