"""The seccomp allowlist against the deny list it replaced: what a system call costs under each.

    .venv/bin/python bench/bench_seccomp.py [--rounds N] [--calls N]

Each sample is a fresh child interpreter that installs one filter on itself
(``prctl(PR_SET_NO_NEW_PRIVS)`` then ``prctl(PR_SET_SECCOMP)``, what bubblewrap and the warm
template do) and then times, with ``perf_counter_ns``: a loop of plain system calls (``stat``,
``getpid``, ``openat`` + ``close``), a loop of argument-filtered ones (``ioctl``, ``socket`` +
``close``, which always run the program), and ``import pandas`` (a few thousand calls of every
kind). The filters: none, the deny list (the refusals and argument rules of the current policy
with every other call allowed: the filter sandcell had before the allowlist), and the allowlist.
Variants are interleaved in shuffled order each round, so load on the shared host hits all alike;
medians are reported with the allowlist's ratio to the deny list measured in the same run. Last,
the number of BPF instructions each filter runs to decide a few calls: the kernel's seccomp action
cache (Linux 5.11+ with CONFIG_CHECKPOINT_RESTORE) skips the program for every call decided by
its number alone, so only the argument-filtered calls (placed first in both) pay for it there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys

from sandcell.backends.host.seccomp import (
    AUDIT_ARCH,
    SYSCALL_NUMBERS,
    build_policy,
    native_arch,
)
from sandcell.backends.host.seccomp.bpf import SECCOMP_RET_ALLOW, FilterSpec, compile_filter

_CHILD = r"""
import ctypes, json, os, socket, struct, sys, time
fd, calls = int(sys.argv[1]), int(sys.argv[2])
if fd >= 0:
    program = os.read(fd, 1 << 20)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0):
        raise OSError(ctypes.get_errno(), "installing the filter")
stat, getpid, open_, close, isatty = os.stat, os.getpid, os.open, os.close, os.isatty
t0 = time.perf_counter_ns()
for _ in range(calls):
    stat("/")
    getpid()
    close(open_("/dev/null", os.O_RDONLY))
t1 = time.perf_counter_ns()
for _ in range(calls):
    isatty(0)
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
t2 = time.perf_counter_ns()
import pandas
t3 = time.perf_counter_ns()
print(json.dumps({"plain": (t1 - t0) / calls / 4, "filtered": (t2 - t1) / calls / 3,
                  "import": (t3 - t2) / 1e6}))
"""

METRICS = {
    "plain": "ns per plain call",
    "filtered": "ns per argument-filtered call",
    "import": "ms for import pandas",
}


def deny_list_program(arch: str) -> bytes:
    """The previous shape of the filter, rebuilt from today's tables: the same named refusals and
    argument rules, everything else allowed."""
    spec = build_policy(arch).spec()
    refusals = {nr: action for nr, action in spec.actions.items() if action != SECCOMP_RET_ALLOW}
    deny = FilterSpec(
        audit_arch=spec.audit_arch,
        kill_x32=spec.kill_x32,
        arg_blocks=spec.arg_blocks,
        actions=refusals,
        default=SECCOMP_RET_ALLOW,
    )
    return compile_filter(deny)


def path_length(program: bytes, nr: int, audit_arch: int, args: tuple[int, ...] = ()) -> int:
    """Instructions the program runs to decide one call (the opcodes sandcell's compiler emits).

    The kernel skips the program entirely for calls whose decision depends on the number alone
    (the seccomp action cache, Linux 5.11+); this is the cost where it does run.
    """
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    data = struct.pack("=iIQ6Q", nr, audit_arch, 0, *args, *(0,) * (6 - len(args)))
    a, pc, steps = 0, 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc, steps = pc + 1, steps + 1
        if code == 0x06:  # RET
            return steps
        if code == 0x20:  # LD W ABS
            (a,) = struct.unpack_from("=I", data, k)
        elif code == 0x54:  # AND K
            a &= k
        elif code == 0x05:  # JA
            pc += k
        else:
            taken = {0x15: a == k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if taken else jf


def sample(program: bytes | None, calls: int) -> dict[str, float]:
    if program is None:
        out = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, "-1", str(calls)],
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(json.loads(out.stdout))
    fd = os.memfd_create("bench-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        out = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, str(fd), str(calls)],
            capture_output=True,
            text=True,
            check=True,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    arch = native_arch()
    variants: dict[str, bytes | None] = {
        "no filter": None,
        "deny list": deny_list_program(arch),
        "allowlist": build_policy(arch).compile(),
    }
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for program in variants.values():  # warm-up: page cache, pandas' bytecode
        sample(program, 100)
    for _ in range(args.rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            samples[name].append(sample(variants[name], args.calls))
    medians = {
        name: {m: statistics.median(s[m] for s in runs) for m in METRICS}
        for name, runs in samples.items()
    }
    # Each round samples every variant close in time: the median of the per-round ratios is what
    # load on a shared host disturbs least.
    paired = {
        m: statistics.median(
            a[m] / d[m] for a, d in zip(samples["allowlist"], samples["deny list"], strict=True)
        )
        for m in METRICS
    }
    sizes = {k: len(p) // 8 for k, p in variants.items() if p is not None}
    print(f"seccomp filters on {arch}: deny list {sizes['deny list']} instructions, "
          f"allowlist {sizes['allowlist']}; {args.rounds} rounds, medians")  # fmt: skip
    print(f"{'':32}" + "".join(f"{k:>12}" for k in variants) + f"{'allow/deny':>12}")
    for metric, label in METRICS.items():
        row = "".join(f"{medians[k][metric]:12.1f}" for k in variants)
        print(f"{label:32}{row}{paired[metric]:11.2f}x")
    print("allow/deny: median over rounds of the allowlist's time over the deny list's")
    print("BPF instructions run per decision, where the kernel runs the program at all:")
    numbers = SYSCALL_NUMBERS[arch]
    probes = {
        "getpid": ("getpid", ()),
        "openat": ("openat", ()),
        "ioctl(TCGETS)": ("ioctl", (0, 0x5401)),
        "socket(AF_UNIX)": ("socket", (1, 1)),
        "clone(fork)": ("clone", (0x01200011,)),
    }
    for label, (name, call_args) in probes.items():
        counts = [
            path_length(p, numbers[name], AUDIT_ARCH[arch], call_args)
            for k, p in variants.items()
            if p is not None
        ]
        print(f"  {label:18} deny list {counts[0]:4}   allowlist {counts[1]:4}")


if __name__ == "__main__":
    main()
