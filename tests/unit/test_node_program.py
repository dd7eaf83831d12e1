"""A Node program's start and end on every rung (``backends/host/node_program.py``): its
arguments and address space in the ``rlimits`` mode, and V8's full heap reported as the memory
limit."""

from __future__ import annotations

import resource
import signal

from sandcell.backends.gvisor import plan as gvisor_plan
from sandcell.backends.host import node_program
from sandcell.backends.host.outcome import V8_HEAP, Seen, classify
from sandcell.backends.host.rlimits import plan_rlimits
from sandcell.runtimes.node.flags import NODE_FLAGS
from sandcell.spec import IsolationMode, Limits, MiB, Outcome

LIMITS = Limits().with_(memory_bytes=256 * MiB)
V8_ABORT = (
    b"<--- Last few GCs --->\n\nFATAL ERROR: Reached heap limit Allocation failed - "
    b"JavaScript heap out of memory\n----- Native stack trace -----\n"
)


def test_strict_mode_keeps_the_runtime_flags_and_python_gets_none() -> None:
    args = node_program.program_args("javascript", NODE_FLAGS, LIMITS, IsolationMode.STRICT)
    assert args == NODE_FLAGS
    assert node_program.program_args("bash", (), LIMITS, IsolationMode.RLIMITS) == ()
    assert node_program.address_reserve("python") == 0


def test_rlimits_mode_bounds_the_heap_and_reserves_address_space() -> None:
    args = node_program.program_args("typescript", NODE_FLAGS, LIMITS, IsolationMode.RLIMITS)
    assert args[: len(NODE_FLAGS)] == NODE_FLAGS
    assert args[len(NODE_FLAGS) :] == ("--max-old-space-size=256", "--disable-wasm-trap-handler")
    reserve = node_program.address_reserve("javascript")
    as_limit = {
        r.resource: r.soft for r in plan_rlimits(LIMITS, IsolationMode.RLIMITS, reserve=reserve)
    }[resource.RLIMIT_AS]
    assert as_limit == 256 * MiB + node_program.ADDRESS_RESERVE
    gv = {r.name: r.value for r in gvisor_plan.plan_rlimits(LIMITS, IsolationMode.RLIMITS)}
    assert gv["RLIMIT_AS"] == 256 * MiB
    gv = {
        r.name: r.value
        for r in gvisor_plan.plan_rlimits(LIMITS, IsolationMode.RLIMITS, reserve=reserve)
    }
    assert gv["RLIMIT_AS"] == 256 * MiB + node_program.ADDRESS_RESERVE


def test_heap_exhausted_needs_the_message_and_an_abort() -> None:
    strict, rlimits = IsolationMode.STRICT, IsolationMode.RLIMITS
    assert node_program.heap_exhausted(V8_ABORT, None, signal.SIGABRT, strict)
    assert node_program.heap_exhausted(V8_ABORT, 134, None, strict)
    assert not node_program.heap_exhausted(V8_ABORT, 1, None, strict)
    assert not node_program.heap_exhausted(b"Error: boom\n", None, signal.SIGABRT, strict)
    # Node's own C++ allocation refused by RLIMIT_AS (the rlimits mode).
    bad_alloc = b"terminate called after throwing an instance of 'std::bad_alloc'\n"
    assert node_program.heap_exhausted(bad_alloc, None, signal.SIGABRT, rlimits)
    # A failed check of V8's as RLIMIT_AS refuses its heap pages: the limit there, a crash else.
    check = b"\n#\n# Fatal error in , line 0\n# Check failed: (result.ptr) != nullptr.\n"
    assert node_program.heap_exhausted(check, None, signal.SIGTRAP, rlimits)
    assert not node_program.heap_exhausted(check, None, signal.SIGTRAP, strict)


def _seen(**kw: object) -> Seen:
    base: dict[str, object] = {
        "subject": "run",
        "limits": LIMITS,
        "mode": IsolationMode.STRICT,
        "wall_time_s": 30.0,
    }
    return Seen(**{**base, **kw})  # type: ignore[arg-type]


def test_a_full_v8_heap_is_the_memory_limit() -> None:
    outcome, reason, _, sig = classify(_seen(signal=signal.SIGABRT, error=V8_HEAP))
    assert outcome is Outcome.MEMORY_LIMIT
    assert f"memory limit of {256 * MiB} bytes reached" in reason
    assert "JavaScript heap out of memory" in reason
    assert sig == signal.SIGABRT
    # The kernel's OOM kill comes first; a plain abort stays a signal; a wall-time stop wins.
    assert classify(_seen(signal=9, oom_killed=True, error=V8_HEAP))[1].endswith("reached")
    assert classify(_seen(signal=signal.SIGABRT))[0] is Outcome.KILLED
    stopped = _seen(signal=signal.SIGABRT, error=V8_HEAP, stopped_by="wall_time")
    assert classify(stopped)[0] is Outcome.TIMEOUT
    weak = classify(_seen(signal=signal.SIGTRAP, error=V8_HEAP, mode=IsolationMode.RLIMITS))
    assert weak[0] is Outcome.MEMORY_LIMIT and "address-space limit" in weak[1]
