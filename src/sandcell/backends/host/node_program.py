"""What a JavaScript or TypeScript program's start and end need beyond a bash program's, on
every rung. Pure.

A Node program starts as ``node *interpreter_args main.js`` (the permission model's flags,
``runtimes/node/flags.py``); its memory is bounded as any program's, with two differences of V8:

* V8 reserves about 750 MiB of address space it never touches (code range, thread stacks,
  cages), so under the ``rlimits`` mode's RLIMIT_AS of the memory limit Node cannot even start.
  There the limit is the memory limit plus :data:`ADDRESS_RESERVE`, and V8's heap is told the
  memory limit (``--max-old-space-size``): a program that fills its heap meets V8's own limit
  before the address space ends, and what it allocates outside the heap (buffers) still meets
  RLIMIT_AS. WebAssembly's bounds are checked by code instead of 10 GiB guard regions
  (``--disable-wasm-trap-handler``): TypeScript's type stripping is itself WebAssembly, and
  could not start otherwise. Under a cgroup (the ``strict`` mode, the microVM's guest), Node
  sizes its heap from the cgroup's limit by itself.
* A full heap is not an ``ENOMEM`` the program sees: V8 prints ``FATAL ERROR: ... JavaScript heap
  out of memory`` and aborts (SIGABRT), and an allocation of Node's own C++ that RLIMIT_AS refuses
  aborts with ``std::bad_alloc``. :func:`heap_exhausted` tells those deaths apart, so that they
  are reported as the memory limit reached rather than a crash.
"""

from __future__ import annotations

import signal

from sandcell.spec import NODE_LANGUAGES, IsolationMode, Language, Limits, MiB

__all__ = [
    "ADDRESS_RESERVE",
    "HEAP_EXHAUSTED",
    "address_reserve",
    "heap_exhausted",
    "layers",
    "program_args",
]

ADDRESS_RESERVE = 1024 * MiB
"""Address space a Node process reserves and never uses, added to RLIMIT_AS in the ``rlimits``
mode (measured: 730 MiB of VmSize for ``console.log(1)`` with Node 22; a margin above)."""

HEAP_EXHAUSTED = (
    "JavaScript heap out of memory",
    "Fatal process out of memory",
    "std::bad_alloc",
)
"""What Node prints before it aborts for want of memory: V8 on a full heap (``FATAL ERROR:
Reached heap limit Allocation failed - JavaScript heap out of memory``), V8 when the system
refuses it memory, the C++ runtime when an allocation of Node's own fails."""
V8_FATAL = ("# Fatal error in",)
"""V8's report of any fatal error (a failed check), which RLIMIT_AS causes as the heap grows."""


def program_args(
    language: Language, interpreter_args: tuple[str, ...], limits: Limits, mode: IsolationMode
) -> tuple[str, ...]:
    """The interpreter's arguments before the program's path: the runtime's, and for a Node
    program in the ``rlimits`` mode, V8's heap limit (no cgroup to size it from) and
    WebAssembly without guard regions (they do not fit RLIMIT_AS)."""
    if language in NODE_LANGUAGES and mode is IsolationMode.RLIMITS:
        heap = f"--max-old-space-size={max(limits.memory_bytes // MiB, 16)}"
        return (*interpreter_args, heap, "--disable-wasm-trap-handler")
    return interpreter_args


def address_reserve(language: Language) -> int:
    """Bytes added to RLIMIT_AS (``rlimits`` mode) for a program in ``language``."""
    return ADDRESS_RESERVE if language in NODE_LANGUAGES else 0


def heap_exhausted(
    stderr: bytes,
    exit_code: int | None,
    sig: int | None,
    mode: IsolationMode,
) -> bool:
    """Whether a run ended as Node ends a program it cannot give more memory: one of
    :data:`HEAP_EXHAUSTED` near the end of stderr (only V8's native stack trace follows it, a few
    KiB of C++ names) and an abort (the signal, or a shell's 128 + 6 where a shell reported it).
    In the ``rlimits`` mode also any fatal error of V8's (``# Fatal error``, a trap): there
    RLIMIT_AS refuses V8 the pages it reserves as its heap grows, which V8 does not survive,
    as Python's MemoryError is the same limit there."""
    dying = (signal.SIGABRT, signal.SIGTRAP) if mode is IsolationMode.RLIMITS else (signal.SIGABRT,)
    aborted = sig in dying or (exit_code is not None and exit_code - 128 in dying)
    tail = stderr[-32768:]
    markers = [*HEAP_EXHAUSTED, *(V8_FATAL if mode is IsolationMode.RLIMITS else ())]
    return aborted and any(m.encode() in tail for m in markers)


def layers(language: Language, mode: IsolationMode) -> dict[str, str]:
    """The enforcement report's lines for a program in ``language`` (none but for Node's)."""
    if language not in NODE_LANGUAGES:
        return {}
    out = {
        "node_permissions": (
            "Node.js permission model (--permission): no child processes, worker threads, "
            "native addons, WASI, internal bindings or inspector; files written only under "
            "/sandbox, /home/user, /tmp and /dev/shm; SIGUSR1 does not start the inspector"
        )
    }
    if mode is IsolationMode.RLIMITS:
        out["node_memory"] = (
            f"V8's heap limited to the memory limit (--max-old-space-size); RLIMIT_AS is the "
            f"memory limit plus {ADDRESS_RESERVE // MiB} MiB V8 reserves unused"
        )
    return out
