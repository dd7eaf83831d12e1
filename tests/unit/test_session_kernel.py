"""Which kernel a session starts, by its language (backends/cell/kernel.py): the command lines
every rung execs, what a microVM guest is sent, the memory saves a Node kernel refuses, and a
kernel V8 aborted on a full heap judged as the memory limit reached.
Pure: the sandboxes that run these are tests/contract/sessions/test_js_sessions.py's."""

from __future__ import annotations

import signal

from sandcell.backends import inside
from sandcell.backends.cell.kernel import (
    guest_kernel,
    kernel_command,
    kernel_file,
    memory_refusal,
)
from sandcell.backends.cell.verdict import classify_cell
from sandcell.backends.host import node_program
from sandcell.runtimes import Runtime
from sandcell.runtimes.node.flags import NODE_FLAGS
from sandcell.spec import IsolationMode, Limits, Outcome

RUNTIME = Runtime(
    name="node",
    language="javascript",
    interpreter="/host/node",
    python="/host/python",
    ro_dirs=(),
    symlinks=(),
    identity="test",
    sha256="0" * 64,
    sandbox_python="/opt/sandcell/venv/bin/python",
    sandbox_interpreter="/opt/sandcell/node/bin/node",
    interpreter_args=NODE_FLAGS,
)


def test_each_language_starts_its_own_kernel() -> None:
    strict, limits = IsolationMode.STRICT, Limits()
    py = kernel_command(
        "python", RUNTIME, limits, strict, paths=["/packages/a"], display="/d.pyc", outputs="/o"
    )
    assert py == [
        "/opt/sandcell/venv/bin/python",
        "-I",
        "/sandcell/kernel.pyc",
        *("--path", "/packages/a", "--display", "/d.pyc", "--outputs", "/o"),
    ]
    # Node: the permission flags before the kernel, no sys.path, --display a switch.
    js = kernel_command(
        "javascript", RUNTIME, limits, strict, paths=["/packages/a"], display="/d", outputs="/o"
    )
    assert js == [
        "/opt/sandcell/node/bin/node",
        *NODE_FLAGS,
        "/sandcell/kernel.mjs",
        *("--display", "--outputs", "/o"),
    ]
    ts = kernel_command("typescript", RUNTIME, limits, IsolationMode.RLIMITS, display="/d")
    # A Node program's arguments in the rlimits mode (V8's heap sized by the memory limit).
    args = node_program.program_args("typescript", NODE_FLAGS, limits, IsolationMode.RLIMITS)
    assert len(args) > len(NODE_FLAGS)
    node = [RUNTIME.sandbox_interpreter, *args]
    assert ts == [*node, "/sandcell/kernel.mjs", "--typescript", "--display"]
    assert kernel_file("typescript") == ("kernel.mjs", inside.NODE_KERNEL_SCRIPT.read_bytes())
    name, code = kernel_file("python")
    assert name == "kernel.pyc" and code[16:]  # a .pyc: header, then the code object


def test_a_guest_is_sent_the_kernel_of_the_session_language() -> None:
    py = guest_kernel("python", outputs="/tmp/.sandcell-outputs")
    assert set(py) == {"kernel_source", "display_source"}
    ts = guest_kernel("typescript", outputs="/tmp/.sandcell-outputs")
    assert ts["kernel_source"] == inside.NODE_KERNEL_SCRIPT.read_text(encoding="utf-8")
    assert ts["kernel_path"] == "/sandcell/kernel.mjs"
    assert ts["kernel_args"] == ["--typescript", "--display", "--outputs", "/tmp/.sandcell-outputs"]


def test_a_node_kernel_never_saves_its_memory() -> None:
    assert memory_refusal("python") is None and memory_refusal("bash") is None
    why = memory_refusal("javascript")
    assert why is not None and "Math.random" in why and "mode=files" in why


def test_a_node_kernel_aborted_on_a_full_heap_met_the_memory_limit() -> None:
    said = b"FATAL ERROR: Reached heap limit Allocation failed - JavaScript"
    said += b" heap out of memory\n 1: 0xb8d0a3 node::OOMErrorHandler\n"
    common = {
        "reply": None,
        "stopped_by": None,
        "ended_why": "kernel",
        "timeout_s": 10.0,
        "limits": Limits(),
        "mode": IsolationMode.STRICT,
        "cg": None,
        "kernel_status": signal.SIGABRT,
        "protocol_error": None,
    }
    outcome, reason, _, sig = classify_cell(**common, stderr=said)  # type: ignore[arg-type]
    assert (outcome, sig) == (Outcome.MEMORY_LIMIT, signal.SIGABRT)
    assert "JavaScript heap" in reason and reason.endswith("the session ended")
    # Another abort is the kernel's crash, as before.
    crashed = classify_cell(**common, stderr=b"Assertion failed\n")  # type: ignore[arg-type]
    assert crashed[0] is Outcome.KILLED
