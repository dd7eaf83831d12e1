"""sandcell batch harness: the main program of a task that has a test, inside the sandbox.

The verdict of such a task must come from somewhere the program cannot write. So the program's
code never runs in this process. This process (the *judge*) makes itself non-dumpable, so that no
other process of the sandbox can open its memory or descriptors through ``/proc`` (the same uid
could otherwise); then forks the *program process*, which gives up the judge's standard input,
makes itself dumpable again and runs the program as ``__main__``. Only then does the judge read the
run's secret from the first line of its standard input (the runner put it there; the rest of the
input is passed on to the program), so the secret is never in memory the program can read.

The judge runs the test in a namespace of its own, where each function the program defined is a
proxy: a call is sent to the program process over a pipe, and the answer comes back as plain data
(None, bools, numbers, strings, bytes, lists, tuples, dicts, sets), decoded by :func:`decode` into
new built-in objects. What the program returns can only be a value, never an object with an
``__eq__`` of its own; modules the program imported are imported again here (standard library
and modules already loaded only), plain-data globals are copied.

The judge writes one line, ``sandcell-batch-verdict SECRET passed`` (or ``failed: why``), to
standard error at its end, and exits with status 0 only when the test ran to its end and the
program process then ended with status 0. The runner counts a task passed only on that line with
this run's secret. A program that prints a verdict line, reads this file (it holds no secret),
exits early, patches builtins or ``sys.exit`` or the harness (in its own process) gets no pass.

Limits of the approach: arguments and results are copied, so a test cannot see the program mutate
an argument in place, and objects that are not plain data cannot cross (classes, generators,
NumPy arrays become lists through ``tolist``). A call that ends the program process fails the test.

This file is standalone on purpose: its source is sent into the sandbox with the task, followed by
a call of :func:`main`; it imports nothing at module level but ``os`` and ``sys``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

VERDICT_PREFIX = "sandcell-batch-verdict "
SECRET_HEX = 32
"""Hex digits of the run's secret; the first line of standard input is exactly these."""
MAX_MESSAGE = 64 * 1024 * 1024
"""Largest message either side accepts: a reply over it fails the test."""
MAX_DEPTH = 200
"""Deepest nesting of containers a message may have."""
_PR_SET_DUMPABLE = 4
_HARNESS_FAILED = 125


class Unsendable(Exception):
    """A value that is not plain data (or nested too deep) cannot be sent."""


class Malformed(Exception):
    """A message that does not decode."""


class ProgramFault(BaseException):
    """The program process ended during a call, or answered with a malformed message.

    A BaseException, so that a test's ``except Exception`` cannot swallow it; the judge also
    remembers it, so that even a test that swallows it with a bare ``except`` does not pass.
    """


class ProgramException(Exception):
    """A program function raised an exception that is not a built-in exception type."""


# ------------------------------------------------------------------------------------------
# Plain data, both ways: a tag byte, then the value. Lengths and counts are decimal, ended by
# ':'; integers and floats are hexadecimal (no digit limit, exact), ended by ';'.


_SEQUENCE_TAGS = ((list, b"L"), (tuple, b"U"), (set, b"E"), (frozenset, b"R"))


def encode(value: object) -> bytes:
    """``value`` as a message; raises :class:`Unsendable` for anything but plain data."""
    out: list[bytes] = []
    _encode(value, out, 0)
    return b"".join(out)


def _encode(value: object, out: list[bytes], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise Unsendable(f"nested deeper than {MAX_DEPTH} levels")
    if value is None:
        out.append(b"N")
    elif value is True or value is False:
        out.append(b"T" if value else b"F")
    elif isinstance(value, int):
        out.append(b"I" + format(int.__index__(value), "x").encode() + b";")
    elif isinstance(value, float):
        out.append(b"D" + float.hex(float(value)).encode() + b";")
    elif isinstance(value, complex):
        c = complex(value)
        out.append(b"C" + float.hex(c.real).encode() + b";" + float.hex(c.imag).encode() + b";")
    elif isinstance(value, str):
        raw = str.encode(value, "utf-8", "surrogatepass")
        out.append(b"S%d:" % len(raw) + raw)
    elif isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        out.append(b"B%d:" % len(raw) + raw)
    elif isinstance(value, dict):
        items = list(dict.items(value))
        out.append(b"M%d:" % len(items))
        for k, v in items:
            _encode(k, out, depth + 1)
            _encode(v, out, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        tag = next(t for cls, t in _SEQUENCE_TAGS if isinstance(value, cls))
        items = list(value)
        out.append(tag + b"%d:" % len(items))
        for item in items:
            _encode(item, out, depth + 1)
    elif hasattr(value, "tolist") and callable(value.tolist):
        # NumPy scalars and arrays: their Python equivalent.
        _encode(value.tolist(), out, depth + 1)
    else:
        raise Unsendable(f"a value of type {type(value).__name__} is not plain data")


def decode(data: bytes) -> object:
    """The value of a message, built from new built-in objects; :class:`Malformed` otherwise."""
    try:
        value, end = _decode(data, 0, 0)
    except (ValueError, TypeError, IndexError, OverflowError, RecursionError) as exc:
        raise Malformed(f"{type(exc).__name__}: {exc}"[:200]) from None
    if end != len(data):
        raise Malformed("trailing bytes after the value")
    return value


def _number(data: bytes, pos: int, end_byte: bytes) -> tuple[str, int]:
    end = data.index(end_byte, pos)
    return data[pos:end].decode("ascii"), end + 1


def _count(data: bytes, pos: int) -> tuple[int, int]:
    text, pos = _number(data, pos, b":")
    if not text.isdigit() or len(text) > 12:
        raise ValueError(f"bad count {text[:20]!r}")
    n = int(text)
    if n > len(data) - pos:
        raise ValueError("a count larger than the message")
    return n, pos


def _decode(data: bytes, pos: int, depth: int) -> tuple[object, int]:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    tag = data[pos : pos + 1]
    pos += 1
    if tag == b"N":
        return None, pos
    if tag in (b"T", b"F"):
        return tag == b"T", pos
    if tag == b"I":
        text, pos = _number(data, pos, b";")
        return int(text, 16), pos
    if tag == b"D":
        text, pos = _number(data, pos, b";")
        return float.fromhex(text), pos
    if tag == b"C":
        re_text, pos = _number(data, pos, b";")
        im_text, pos = _number(data, pos, b";")
        return complex(float.fromhex(re_text), float.fromhex(im_text)), pos
    if tag in (b"S", b"B"):
        n, pos = _count(data, pos)
        raw = data[pos : pos + n]
        value = raw.decode("utf-8", "surrogatepass") if tag == b"S" else bytes(raw)
        return value, pos + n
    if tag == b"M":
        n, pos = _count(data, pos)
        mapping: dict[object, object] = {}
        for _ in range(n):
            key, pos = _decode(data, pos, depth + 1)
            mapping[key], pos = _decode(data, pos, depth + 1)
        return mapping, pos
    if tag in (b"L", b"U", b"E", b"R"):
        n, pos = _count(data, pos)
        items: list[object] = []
        for _ in range(n):
            item, pos = _decode(data, pos, depth + 1)
            items.append(item)
        if tag == b"L":
            return items, pos
        if tag == b"U":
            return tuple(items), pos
        return (set(items) if tag == b"E" else frozenset(items)), pos
    raise ValueError(f"unknown tag {tag!r}")


# ------------------------------------------------------------------------------------------
# Framing: an 8-byte length, then the message.


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(fd: int, data: bytes) -> None:
    _write_all(fd, len(data).to_bytes(8, "big") + data)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> bytes | None:
    """The next message, or None at end of file; :class:`Malformed` for an oversized one."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    n = int.from_bytes(head, "big")
    if n > MAX_MESSAGE:
        raise Malformed(f"a message of {n} bytes, over the cap of {MAX_MESSAGE}")
    body = _read_exactly(fd, n)
    if body is None:
        return None
    return body


# ------------------------------------------------------------------------------------------
# The program process


def _print_exception(exc: BaseException, skip: int, sources: dict[str, str]) -> None:
    import linecache
    import traceback

    for name, text in sources.items():
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()


def _globals_for_test(namespace: dict[str, object]) -> bytes:
    """What the test may use of the program's globals: functions, modules, plain data."""
    functions: list[str] = []
    modules: list[tuple[str, str]] = []
    data: list[tuple[str, object]] = []
    budget = 8 << 20
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, type(sys)):
            modules.append((name, str(getattr(value, "__name__", ""))))
        elif callable(value):
            functions.append(name)
        else:
            try:
                size = len(encode(value))
            except (Unsendable, RecursionError):
                continue  # not plain data: the test cannot use it
            if size <= budget:
                data.append((name, value))
                budget -= size
    return encode(("ready", tuple(functions), tuple(modules), tuple(data)))


def _serve(namespace: dict[str, Any], calls: int, replies: int) -> None:
    """Answer the judge's calls until it closes its end."""
    while (message := receive(calls)) is not None:
        # From the judge: trusted, and always ("call", name, args, kwargs).
        call: Any = decode(message)
        _, name, args, kwargs = call
        try:
            result = namespace[name](*args, **kwargs)
            try:
                reply = encode(("ok", result))
            except (Unsendable, RecursionError) as exc:
                why = f"the result cannot be passed to the test: {exc}"
                reply = encode(("raise", "TypeError", why))
        except Exception as exc:
            reply = encode(("raise", type(exc).__name__, str(exc)[:2000]))
        send(replies, reply)


def _program(program: str, stdin_r: int, calls: int, replies: int, libc: object) -> NoReturn:
    os.dup2(stdin_r, 0)
    os.close(stdin_r)
    # Dumpable again, as any program is: only the judge needs to be out of reach.
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # type: ignore[attr-defined]
    import builtins

    main = type(sys)("__main__")
    main.__dict__["__file__"] = sys.argv[0] if sys.argv else "main.py"
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    try:
        exec(compile(program, "<program>", "exec"), main.__dict__)  # noqa: S102 - it is the program
        send(replies, _globals_for_test(main.__dict__))
        _serve(main.__dict__, calls, replies)
    except SystemExit:
        raise  # the boot ends the process as python would
    except BaseException as exc:
        _print_exception(exc, 1, {"<program>": program})
        raise SystemExit(1) from None
    raise SystemExit(0)


# ------------------------------------------------------------------------------------------
# The judge


class _Judge:
    def __init__(self, pid: int, calls: int, replies: int) -> None:
        self.pid = pid
        self.calls = calls
        self.replies = replies
        self.fault: str | None = None
        self.status: int | None = None

    def reap(self) -> int:
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        return self.status

    def _fault(self, why: str) -> ProgramFault:
        if self.fault is None:
            self.fault = why
        return ProgramFault(why)

    def call(self, name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if self.fault is not None:
            raise ProgramFault(self.fault)
        try:
            send(self.calls, encode(("call", name, args, kwargs)))
        except BrokenPipeError:
            raise self._fault(f"the program process ended ({_status_text(self.reap())})") from None
        try:
            message = receive(self.replies)
            if message is None:
                raise self._fault(
                    f"the program process ended during a call of {name}() "
                    f"({_status_text(self.reap())})"
                )
            reply = decode(message)
        except Malformed as exc:
            raise self._fault(f"the program process sent a malformed reply: {exc}") from None
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if type(reply) is tuple and len(reply) == 3 and reply[0] == "raise":
            kind, message_text = str(reply[1]), str(reply[2])

            raise _rebuilt(kind, message_text)
        raise self._fault("the program process sent a reply of the wrong shape")

    def proxy(self, name: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            return self.call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def namespace(self, ready: object) -> dict[str, object]:
        import builtins

        ok = (
            type(ready) is tuple
            and len(ready) == 4
            and ready[0] == "ready"
            and all(type(n) is str for n in ready[1])
            and all(type(m) is tuple and len(m) == 2 and type(m[0]) is str for m in ready[2])
            and all(type(d) is tuple and len(d) == 2 and type(d[0]) is str for d in ready[3])
        )
        if not ok:
            raise self._fault("the program process announced its functions in the wrong shape")
        assert isinstance(ready, tuple)
        ns: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
        for name, value in ready[3]:
            ns[name] = value
        for alias, module in ready[2]:
            if type(module) is str and _importable(module):
                try:
                    __import__(module)
                    ns[alias] = sys.modules[module]
                except Exception:  # noqa: S110 - a name the test will miss, and say so
                    pass
        for name in ready[1]:
            ns[name] = self.proxy(name)
        return ns


def _rebuilt(kind: str, message: str) -> Exception:
    """The program's exception as the test sees it: a built-in type by name (so ``except
    ValueError`` works), else :class:`ProgramException`; never a class the program made."""
    import builtins

    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:
            pass  # one that needs more arguments (UnicodeDecodeError): the generic one below
    return ProgramException(f"{kind}: {message}")


def _importable(module: str) -> bool:
    """A module the judge may import on the program's word: nothing the sandbox could write."""
    return module in sys.modules or module.partition(".")[0] in sys.stdlib_module_names


def _status_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _read_secret() -> str | None:
    line = _read_exactly(0, SECRET_HEX + 1)
    if line is None or not line.endswith(b"\n"):
        return None
    text = line[:-1].decode("ascii", "replace")
    if len(text) != SECRET_HEX or any(c not in "0123456789abcdef" for c in text):
        return None
    return text


def _relay_stdin(stdin_w: int) -> None:
    """The rest of standard input, to the program process; in a thread when it is large."""
    data = b""
    while chunk := os.read(0, 1 << 16):
        data += chunk
        if len(data) > 1 << 15:
            import _thread

            _thread.start_new_thread(_pump, (stdin_w, data))
            return
    _pump(stdin_w, data)


def _pump(stdin_w: int, first: bytes) -> None:
    try:
        _write_all(stdin_w, first)
        while chunk := os.read(0, 1 << 16):
            _write_all(stdin_w, chunk)
    except OSError:
        pass  # the program closed its input: what it did not read is dropped
    finally:
        os.close(stdin_w)


def _verdict(secret: str, text: str) -> None:
    """The verdict line; every exit of the judge comes right after it (``os._exit``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    shown = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))[:500]
    line = "\n" + VERDICT_PREFIX + secret + " " + shown + "\n"
    _write_all(2, line.encode("utf-8", "backslashreplace"))


def _exit_as(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


def _boot_failure(message: str) -> NoReturn:
    _write_all(2, f"sandcell-batch: {message}\n".encode())
    os._exit(_HARNESS_FAILED)


def main(program: str, test: str) -> NoReturn:
    """Run ``program`` in a process of its own and ``test`` here; see the module."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        _boot_failure("cannot make the judge non-dumpable; no verdict")
    sys.stdout.flush()
    sys.stderr.flush()
    calls_r, calls_w = os.pipe()
    replies_r, replies_w = os.pipe()
    stdin_r, stdin_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:  # a process cap of one (max_pids): the test cannot be run apart
        _boot_failure(f"cannot start the program's process ({exc.strerror}); no verdict")
    if pid == 0:
        for fd in (calls_w, replies_r, stdin_w):
            os.close(fd)
        _program(program, stdin_r, calls_r, replies_w, libc)
    for fd in (calls_r, replies_w, stdin_r):
        os.close(fd)
    # The program process holds neither this stdin nor a way into this process: now the secret.
    secret = _read_secret()
    if secret is None:
        os.kill(pid, 9)
        _boot_failure("no run secret on the first line of standard input; no verdict")
    _relay_stdin(stdin_w)
    judge = _Judge(pid, calls_w, replies_r)
    try:
        message = receive(replies_r)
        ready = decode(message) if message is not None else None
    except Malformed as exc:
        ready, judge.fault = None, f"the program process sent a malformed message: {exc}"
    if ready is None:
        os.close(calls_w)
        status = judge.reap()
        _verdict(
            secret,
            "failed: the test did not run to completion: "
            + (judge.fault or f"the program ended before it ({_status_text(status)})"),
        )
        _exit_as(status)
    raised: BaseException | None = None
    try:
        exec(compile(test, "<test>", "exec"), judge.namespace(ready))  # noqa: S102 - the test
    except BaseException as exc:
        raised = exc
    os.close(calls_w)
    if raised is not None:
        if not isinstance(raised, ProgramFault):
            _print_exception(raised, 1, {"<test>": test})
        if isinstance(raised, SystemExit):
            why = "the test called exit() before its end"
        elif judge.fault is not None:
            why = f"the test did not run to completion: {judge.fault}"
        else:
            why = f"the test raised {type(raised).__name__}"
        judge.reap()
        _verdict(secret, f"failed: {why}")
        os._exit(1)
    status = judge.reap()
    if judge.fault is not None:
        _verdict(secret, f"failed: the test did not run to completion: {judge.fault}")
        os._exit(1)
    if status != 0:
        _verdict(secret, f"failed: the program process ended with {_status_text(status)}")
        _exit_as(status)
    _verdict(secret, "passed")
    os._exit(0)
