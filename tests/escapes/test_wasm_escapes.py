"""Escapes from the wasm rung: a Python program in Pyodide tries to reach JavaScript, Node.js,
native code, processes, the network and the host's files, as root and as an ordinary user.

Each test is one way out, and asserts it fails and how: the lockdown's ImportError, Emscripten's
missing processes, a Wasm filesystem without the host's files, Node's refusal of code from
strings, the permission model stopping native code. The runner is the contract suite's
(tests/contract/test_wasm.py); the host-side listener is this directory's (conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.conftest import Sandbox
from tests.contract.test_wasm import IDENTITIES, wasm_sandbox

if TYPE_CHECKING:
    from .conftest import Listener


@pytest.fixture(params=IDENTITIES)
def wasm(request: pytest.FixtureRequest, root_home: Path, tmp_path: Path) -> Sandbox:
    return wasm_sandbox(request, str(request.param), root_home, tmp_path)


def _show(r: dict[str, object]) -> str:
    return f"{r['outcome']} ({r['reason']}): stdout={r['stdout']!r} stderr={r['stderr']!r}"


def _lines(r: dict[str, object]) -> list[str]:
    assert r["outcome"] == "ok", _show(r)
    return str(r["stdout"]).splitlines()


TRY = """
def attempt(what, fn):
    try:
        got = fn()
    except BaseException as e:
        print(what, "->", type(e).__name__, e)
    else:
        print(what, "-> BREACH", repr(got)[:200])
"""


JS_IMPORTS = (
    "import js",
    "import pyodide",
    "from pyodide.ffi import to_js",
    "import pyodide.http",
    "import pyodide_js",
    "import _pyodide_core",
    "import micropip",
)


def test_no_module_reaches_javascript(wasm: Sandbox) -> None:
    r = wasm.run(TRY + "".join(f"attempt({s!r}, lambda: exec({s!r}))\n" for s in JS_IMPORTS))
    lines = _lines(r)
    assert len(lines) == len(JS_IMPORTS), lines
    for stmt, line in zip(JS_IMPORTS, lines, strict=True):
        assert line.startswith(f"{stmt} -> ImportError"), line
        assert "no way to JavaScript or to Node.js" in line, line


def test_no_ctypes(wasm: Sandbox) -> None:
    r = wasm.run(TRY + "attempt('ctypes', lambda: __import__('ctypes'))")
    assert _lines(r) == [
        "ctypes -> ImportError ctypes is not available on the wasm rung: it would call native code"
    ]


def test_no_processes(wasm: Sandbox) -> None:
    r = wasm.run(
        TRY
        + """
import os, subprocess
attempt("os.system", lambda: os.system("id"))
attempt("os.fork", lambda: os.fork())
attempt("subprocess", lambda: subprocess.run(["id"], capture_output=True))
"""
    )
    system, fork, sub = _lines(r)
    assert system == "os.system -> OSError [Errno 52] the wasm rung has no processes", system
    assert fork == "os.fork -> OSError [Errno 52] the wasm rung has no processes", fork
    assert sub.startswith("subprocess -> OSError") and "does not support processes" in sub, sub


def test_no_network_to_host_loopback(wasm: Sandbox, tcp_listener: Listener) -> None:
    r = wasm.run(
        TRY
        + f"""
import socket
def connect():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(("127.0.0.1", {tcp_listener.port}))
    return s.recv(16) or "connected"
attempt("connect", connect)
"""
    )
    [line] = _lines(r)
    assert line.startswith("connect -> OSError"), line
    assert not tcp_listener.stop(), f"[{wasm.identity}] ESCAPE: {tcp_listener.seen}"


def test_host_files_are_not_in_the_wasm_filesystem(wasm: Sandbox) -> None:
    r = wasm.run(
        TRY
        + """
import os
for path in ("/proc/self/status", "/etc/passwd", "/etc/hostname", "/root/.bashrc"):
    attempt(path, lambda: open(path).read(64))
for path in ("/usr/bin", "/var/lib/sandcell", "/packages", "/sys"):
    attempt(path, lambda: os.listdir(path))
# The run's control directory holds the runner, the lockdown and the settings: the program sees
# only its own text there, written into the Wasm filesystem for its tracebacks.
print(sorted(os.listdir("/sandcell")))
"""
    )
    *refused, control = _lines(r)
    assert len(refused) == 8, refused
    for line in refused:
        assert "-> FileNotFoundError" in line or "-> PermissionError" in line, line
    assert control == "['main.py']", control


def test_writes_outside_the_workspace_do_not_reach_the_host(wasm: Sandbox, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("original\n")
    data.chmod(0o644)
    r = wasm.run(
        TRY
        + """
def write(path):
    with open(path, "w") as f:
        f.write("changed")
attempt("input", lambda: write("/inputs/data.txt"))
attempt("new input", lambda: write("/inputs/new.txt"))
""",
        inputs=[data],
    )
    existing, new = _lines(r)
    assert "-> BREACH" not in existing and "Error" in existing, existing
    assert "-> BREACH" not in new and "Error" in new, new
    assert data.read_text() == "original\n"
    assert not (tmp_path / "new.txt").exists()


def test_ctypes_after_removing_the_lockdowns_finder_runs_no_command(wasm: Sandbox) -> None:
    """The finder is an ordinary object the program can remove; ctypes then imports, and its
    call into the C library's system() is stopped (Node's permission model refuses the native
    call and the run ends in error): no file is made."""
    r = wasm.run(
        """
import sys
sys.meta_path.pop(0)
import ctypes
ctypes.CDLL(None).system(b"touch /sandbox/pwned")
print("after system()")
""",
        exports=["pwned"],
    )
    assert r["outcome"] == "error", _show(r)
    assert "after system()" not in str(r["stdout"]), _show(r)
    assert r["artifacts"] == [], r["artifacts"]


def test_no_code_from_strings_through_pyodide_core(wasm: Sandbox) -> None:
    """``_pyodide_core`` is compiled in and imports again once the finder is gone; the
    JavaScript objects it makes lead to Function, which may not compile strings."""
    r = wasm.run(
        """
import sys
sys.meta_path.pop(0)
import _pyodide_core
f = _pyodide_core.to_js([1]).constructor.constructor("return process")
print("compiled", f)
print("process", f())
"""
    )
    assert r["outcome"] == "error", _show(r)
    assert "compiled" not in str(r["stdout"]), _show(r)
    assert "Code generation from strings disallowed" in str(r["stderr"]), _show(r)


# Pyodide makes one JsProxy class per set of type flags, all of one metaclass: every object that
# is an instance of one, or holds one, counts.
def test_no_javascript_object_is_reachable_from_python(wasm: Sandbox) -> None:
    r = wasm.run(
        """
import gc
objects = gc.get_objects()
meta = {type(o) for o in objects if type(o).__name__ == "_JsProxyMetaClass"}
def js(o):
    return type(o).__name__.startswith("JsProxy") or type(type(o)) in meta
found = {type(o).__name__ for o in objects if js(o)}
found |= {f"{type(o).__name__}->{type(r).__name__}" for o in objects for r in gc.get_referents(o)
          if js(r)}
print(sorted(found))
"""
    )
    assert _lines(r) == ["[]"], _show(r)
