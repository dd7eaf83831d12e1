"""A cold run's pid 1 is the native init (``inside/_init.c``) where a C compiler built it, and the
boot's Python supervisor otherwise: both report how the program really ended.

The init forks the boot, which runs the program in its own process; the init reaps, writes the
program's raw wait status on the status pipe and exits as it did. Without it, the boot forks a
supervisor of its own. Either way an exit status of 137 and death by SIGKILL stay apart, the
program never holds the status descriptor nor sees the variable that names it to the init, and
it cannot end its pid 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandcell import Executor, Outcome, RunRequest
from sandcell.backends.host import native_init
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.runtimes import runtime_for

_PID_1 = """
import os, signal
print(open("/proc/1/cmdline").read().split("\\0")[0])
print(sorted(k for k in os.environ if k.startswith("SANDCELL")))
print(sorted(os.listdir("/proc/self/fd")))
try:
    os.kill(1, signal.SIGKILL)  # ignored from inside the namespace, or refused by Landlock
except OSError:
    pass
print("alive")
"""

_ENDINGS = [
    ("import os; os._exit(3)", Outcome.ERROR, 3, None),
    ("raise SystemExit(137)", Outcome.ERROR, 137, None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", Outcome.KILLED, None, 9),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", Outcome.KILLED, None, 11),
]


def _executor(tmp_path: Path) -> Executor:
    ex = Executor(home=tmp_path / "home", profile="unchecked")
    if not isinstance(ex.backend, NamespacesBackend):
        ex.close()
        pytest.skip("these runs are the namespaces backend's")
    return ex


def _check(ex: Executor, pid_1: str) -> None:
    r = ex.run(RunRequest(code=_PID_1))
    assert r.outcome is Outcome.OK, r.stderr
    first, env, fds, alive = r.stdout.splitlines()
    assert first == pid_1
    assert env == "[]", "the status descriptor's variable reached the program"
    assert fds == "['0', '1', '2', '3']", "a descriptor besides stdio (3: the listing's own)"
    assert alive == "alive"
    for code, outcome, exit_code, signal in _ENDINGS:
        r = ex.run(RunRequest(code=code))
        assert (r.outcome, r.exit_code, r.signal) == (outcome, exit_code, signal), (code, r)
    b = ex.run(RunRequest(code="echo hi; exit 4", language="bash"))
    assert (b.outcome, b.exit_code, b.stdout) == (Outcome.ERROR, 4, "hi\n"), b


def test_the_native_init_is_pid_1_of_a_cold_run(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this host: cold runs use the boot's Python supervisor")
    with _executor(tmp_path) as ex:
        backend = ex.backend
        assert isinstance(backend, NamespacesBackend)
        assert backend.native_init is not None, "cc is there, yet the init was not built"
        _check(ex, "/sandcell/init")


def test_without_the_native_init_the_boot_supervises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_NATIVE_INIT", "0")
    with _executor(tmp_path) as ex:
        backend = ex.backend
        assert isinstance(backend, NamespacesBackend)
        assert backend.native_init is None
        _check(ex, runtime_for("python").sandbox_python)


def test_an_init_that_cannot_be_built_is_none(tmp_path: Path) -> None:
    # The boot's Python supervisor stays in use: no compiler, or one that fails.
    (tmp_path / "etc").mkdir()
    assert native_init.build(tmp_path, compiler="no-such-compiler-here") is None
    assert native_init.build(tmp_path, compiler="false") is None
    assert list((tmp_path / "etc").iterdir()) == []
