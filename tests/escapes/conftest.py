"""Helpers for the escape suite: attack programs with visible verdicts, and host-side observers.

Every attack prints one line per attempt: ``blocked: <what> -> <errno>`` when the sandbox stopped
it, ``BREACH <what>`` when it got through, ``UNEXPECTED <what>`` when it failed for a reason that
says nothing either way (a wrong errno: the call reached a kernel path it should not have). The
program ends with :data:`END`, so a program that crashed half-way never passes.
:meth:`Attack.expect_blocked` checks all of that at once and shows the whole run when it fails.

Attacks that only the host can judge (a connection that must not arrive, a process that must
survive) pair the run with an observer started by the test.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import run_as_user

END = "ATTACK-COMPLETE"

PRELUDE = '''\
import ctypes, errno, os, socket, stat, sys

_libc = ctypes.CDLL(None, use_errno=True)


def errname(exc):
    if isinstance(exc, socket.gaierror):
        return f"gaierror {exc.args[0]}"
    if isinstance(exc, TimeoutError) and exc.errno is None:
        return "timeout"
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__


def breach(what, why=None):
    # why: what was seen, when breach and blocked are chosen between with the same arguments.
    print("BREACH", what if why is None else f"{what}: {why}", flush=True)


def blocked(what, why):
    print("blocked:", what, "->", why, flush=True)


def unexpected(what, why):
    print("UNEXPECTED", what, "->", why, flush=True)


def attempt(what, fn, ok=None):
    """Run fn; an OSError (with an errno in ok, if given) is blocked, a return value a breach."""
    try:
        r = fn()
    except OSError as exc:
        if ok is None or exc.errno in ok:
            blocked(what, errname(exc))
        else:
            unexpected(what, errname(exc))
    else:
        breach(f"{what}: {r!r}"[:500])


def _arg(a):
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a


def raw_syscall(what, nr, *args, ok=(errno.EPERM,)):
    """A raw system call; -1 with an errno in ok is blocked, any other result is not."""
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *map(_arg, args))
    if r == -1:
        err = ctypes.get_errno()
        name = errno.errorcode.get(err, str(err))
        (blocked if err in ok else unexpected)(what, name)
    else:
        breach(f"{what} returned {r}")
    return r

'''


NATIVE = ("raw_syscall", "_libc", "ctypes")
"""What an attack needs native code for: on the wasm rung, which has none, it cannot apply."""


def _wasm_prelude() -> str:
    """The prelude without ctypes (refused on the wasm rung, and its system calls do not
    exist there: a program in WebAssembly reaches only Pyodide's own emulation of them)."""
    keep, skip = [], False
    for line in PRELUDE.splitlines(keepends=True):
        if line.startswith(("def _arg", "def raw_syscall", "_libc =")):
            skip = not line.startswith("_libc =")
            continue
        if skip and line.strip() and not line.startswith((" ", "\t")):
            skip = False
        if not skip:
            keep.append(line.replace("import ctypes, errno", "import errno"))
    return "".join(keep)


def attack_code(body: str, *, backend: str = "namespaces") -> str:
    """An attack program: the prelude, the body (dedented), the completion marker. On the wasm
    rung an attack that needs native code skips with the reason (it cannot be attempted)."""
    text = textwrap.dedent(body).strip("\n")
    prelude = PRELUDE
    if backend == "wasm":
        used = [n for n in NATIVE if n in text]
        if used:
            pytest.skip(
                f"the wasm rung has no native code and no system calls of its own: "
                f"{', '.join(used)} cannot be attempted there (ctypes is refused, "
                "tests/contract/test_wasm.py)"
            )
        prelude = _wasm_prelude()
    return prelude + text + f"\nprint({END!r}, flush=True)\n"


def _show(result: Mapping[str, object]) -> str:
    return (
        f"outcome={result.get('outcome')} reason={result.get('reason')!r}\n"
        f"--- stdout ---\n{result.get('stdout')}\n--- stderr ---\n{result.get('stderr')}"
    )


@dataclass(frozen=True)
class Attack:
    """Runs attack programs in one identity's sandbox."""

    sandbox: Any
    """The shared ``sandbox`` fixture's runner (tests/conftest.py)."""
    identity: str
    home: Path

    def run(self, body: str, *, raw: bool = False, **kw: Any) -> dict[str, object]:
        code = body if raw else attack_code(body, backend=self.sandbox.backend)
        result: dict[str, object] = self.sandbox.run(code, **kw)
        return result

    def expect_blocked(
        self, result: Mapping[str, object], *, attempts: int | None = None, outcome: str = "ok"
    ) -> str:
        """Assert the attack ran to its end, nothing got through and every attempt was blocked."""
        out = str(result.get("stdout", ""))
        where = f"[{self.identity}] "
        if os.environ.get("SANDCELL_ESCAPE_SHOW"):  # pytest -s: see every verdict
            print(f"\n{where}{_show(result)}")
        assert "BREACH" not in out, where + "ESCAPE: " + _show(result)
        assert "UNEXPECTED" not in out, where + "an attempt failed oddly: " + _show(result)
        assert result.get("outcome") == outcome, where + "wrong outcome: " + _show(result)
        assert END in out, where + "the attack did not run to its end: " + _show(result)
        n = out.count("blocked:")
        if attempts is None:
            assert n >= 1, where + "no attempt reported blocked: " + _show(result)
        else:
            assert n == attempts, where + f"{n} of {attempts} attempts reported: " + _show(result)
        return out


@pytest.fixture
def attack(sandbox: Any) -> Attack:
    return Attack(sandbox=sandbox, identity=sandbox.identity, home=sandbox.home)


@pytest.fixture
def token() -> str:
    """A marker unique to this test, to recognise what the attack left behind."""
    return f"sandcell-escape-{secrets.token_hex(6)}"


# -- host state handed to the sandboxing process --------------------------------------------------


@pytest.fixture
def run_with_host_state(
    attack: Attack, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., dict[str, object]]:
    """``run(body, env={...}, pass_fds=(...))``: a run whose *sandboxing process* holds the given
    environment variables and inherited descriptors, in both identities.

    As root the executor runs in this process: the variables are set in ``os.environ`` and the
    descriptors are simply open and inheritable here. As the user, the CLI is started with them
    (the shared fixture starts it with a clean environment and no descriptors, which would test
    nothing).
    """

    def run(
        body: str, *, env: Mapping[str, str], pass_fds: Sequence[int] = (), **kw: Any
    ) -> dict[str, object]:
        if attack.identity == "root":
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            for fd in pass_fds:
                os.set_inheritable(fd, True)
            return attack.run(body, **kw)
        import json

        unpriv = request.getfixturevalue("unpriv")
        code = attack_code(body, backend=attack.sandbox.backend)
        args = ["run", "--json", "--profile", "unchecked", "-c", code]
        if unpriv.mode.value == "rlimits":
            args.insert(1, "--isolation=rlimits")
        if attack.sandbox.start != "cold":
            args.insert(1, f"--start={attack.sandbox.start}")
        if attack.sandbox.backend != "namespaces":
            args.insert(1, f"--backend={attack.sandbox.backend}")
        proc = run_as_user(unpriv, args, extra_env=env, pass_fds=tuple(pass_fds))
        try:
            out: dict[str, object] = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise AssertionError(
                f"sandcell printed no JSON (exit {proc.returncode}): {proc.stderr.decode()}"
            ) from None
        return out

    return run


# -- host-side observers --------------------------------------------------------------------------


@dataclass
class Listener:
    """A host socket that records every connection or datagram and answers ``PONG``."""

    sock: socket.socket
    port: int
    seen: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Listener:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                if self.sock.type == socket.SOCK_STREAM:
                    conn, peer = self.sock.accept()
                    self.seen.append(f"connection from {peer!r}")
                    with contextlib.suppress(OSError), conn:
                        conn.sendall(b"PONG\n")
                else:
                    data, peer = self.sock.recvfrom(4096)
                    self.seen.append(f"datagram {data[:64]!r} from {peer!r}")
                    with contextlib.suppress(OSError):
                        self.sock.sendto(b"PONG\n", peer)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close()
        return self.seen


def _listener(family: int, kind: int, address: Any) -> Listener:
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen(16)
    port = sock.getsockname()[1] if family in (socket.AF_INET, socket.AF_INET6) else 0
    return Listener(sock=sock, port=port).start()


@pytest.fixture
def tcp_listener() -> Iterator[Listener]:
    lst = _listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
    yield lst
    lst.stop()


@pytest.fixture
def udp_listener() -> Iterator[Listener]:
    lst = _listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
    yield lst
    lst.stop()


@pytest.fixture
def unix_listener_factory() -> Iterator[Callable[[str | bytes], Listener]]:
    made: list[Listener] = []

    def make(address: str | bytes) -> Listener:
        lst = _listener(socket.AF_UNIX, socket.SOCK_STREAM, address)
        if isinstance(address, str) and not address.startswith("\0"):
            os.chmod(address, 0o777)  # so that the user identity could connect, were it visible
        made.append(lst)
        return lst

    yield make
    for lst in made:
        lst.stop()


def processes_with(marker: str) -> list[str]:
    """Host processes whose command line contains ``marker``: ``"pid: cmdline"``."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {shown}")
    return found
