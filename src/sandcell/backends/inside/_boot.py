"""sandcell boot: the first thing that runs inside the sandbox, right before the untrusted program.

Usage (inside the sandbox)::

    python -I /sandcell/boot.py /sandcell/plan.json python /sandcell/main.py [ARGS...]
    python -I /sandcell/boot.py /sandcell/plan.json exec /bin/bash /sandcell/main.sh [ARGS...]

Steps: read the plan; close every inherited descriptor above 2 but the status one; start the
egress bridge when the plan names one (``_start_bridge``: a child that listens on loopback and
forwards to the run's proxy socket) and wait until it listens, then a session's ingress agent
the same way when the plan names one (it connects to the session's ``ingress.sock``); fork. The
parent stays outside the program, trusted and idle, and reports the child's raw wait status on
the status descriptor, then exits as the child did. The child sets no_new_privs, applies the
Landlock ruleset the host compiled (see ``landlock.py``), creates the input links, writes one
byte ("started") to the status descriptor and closes it, and runs the program. In ``python`` mode
the script runs in that process as a fresh ``__main__``, as ``python SCRIPT`` would run it (argv,
``__file__``, tracebacks, exit statuses), or, when the plan has a ``display`` section, as one
notebook cell of ``_display.run_cell`` (loaded before the fork, from the compiled module the plan
names); in ``exec`` mode the argv is ``execv``-ed. A boot
failure exits with status 125 and a ``sandcell-boot:`` line on stderr. Without a status
descriptor (outside sandcell) there is no fork; nor when the plan says ``supervised``: the
sandbox's pid 1 above the boot (the native init, ``_init.c``) then waits and reports in the
parent's place, and the steps of the child run in the boot's own process.

This file is standalone on purpose: it is copied into the sandbox and must not import sandcell.
It runs on every sandboxed run, so it imports as little as it can: ``_ctypes`` only when there is a
ruleset to apply, and not ``json`` (which pulls in ``re``, about 10 ms): the plan is parsed with
the C scanner of ``_json``.

Security limitations: Landlock is applied after the interpreter started, so the interpreter's own
startup (and ``site``) is not landlocked; it runs no user code, and seccomp, the namespaces and the
read-only mounts are the outer walls that hold during it. The boot's frames stay on the stack
under the program's (``sys._getframe``); they hold nothing the program could not read anyway.
"""

from __future__ import annotations

# os.path, not pathlib: pathlib pulls in re and urllib, milliseconds on every run.
import os
import sys

# typing is not imported at run time (it costs milliseconds); mypy treats this name as True.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

_BOOT_FAILED = 125
# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the generic syscall table,
# the same numbers on x86_64, aarch64 and every architecture the host side accepts.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38
_S_IFMT = 0o170000
_S_IFDIR = 0o040000
_PY_FILE_INPUT = 257


def _fail(message: str) -> NoReturn:
    os.write(2, f"sandcell-boot: {message}\n".encode("utf-8", "backslashreplace"))
    os._exit(_BOOT_FAILED)


class _JsonContext:
    # The attributes the C scanner of _json reads from its context (json.decoder.JSONDecoder's).
    strict = True
    object_hook = None
    object_pairs_hook = None
    array_hook = None  # read by Python >= 3.15
    parse_float = float
    parse_int = int
    parse_constant = float


def _parse_json(text: str) -> Any:
    try:
        from _json import make_scanner  # here: a fallback follows

        scan = make_scanner(_JsonContext)  # type: ignore[arg-type]
    except (ImportError, AttributeError, TypeError):  # another implementation: the real thing
        import json  # only where _json is missing

        return json.loads(text)
    text = text.strip(" \t\r\n")
    try:
        value, end = scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _load_plan(
    path: str,
) -> tuple[
    dict[str, Any] | None,
    int | None,
    list[list[str]],
    list[str],
    dict[str, str] | None,
    list[str] | None,
    list[str] | None,
    bool,
]:
    """(landlock section or None, status fd or None, input links, extra python paths, display
    section or None, bridge command or None, ingress agent command or None, whether a pid 1
    above supervises the program), checked for shape."""
    with open(path, encoding="utf-8") as f:
        doc = _parse_json(f.read())
    if not isinstance(doc, dict) or doc.get("format") != 1:
        raise ValueError("not a sandcell boot plan of format 1")
    landlock = doc.get("landlock")
    status_fd = doc.get("status_fd")
    links = doc.get("input_links") or []
    python_paths = doc.get("python_paths") or []
    display = doc.get("display")
    bridge = doc.get("bridge")
    ingress = doc.get("ingress")
    supervised = doc.get("supervised", False)
    if type(supervised) is not bool or (
        supervised and (status_fd is None or bridge is not None or ingress is not None)
    ):
        raise ValueError(f"malformed supervised {supervised!r}")
    for name, helper in (("bridge", bridge), ("ingress agent", ingress)):
        if helper is not None and not (
            isinstance(helper, list) and helper and all(type(a) is str for a in helper)
        ):
            raise ValueError(f"malformed {name} {helper!r}")
    if display is not None and not (
        isinstance(display, dict) and all(type(display.get(k)) is str for k in ("dir", "module"))
    ):
        raise ValueError(f"malformed display section {display!r}")
    if not all(type(p) is str and p.startswith("/") for p in python_paths):
        raise ValueError(f"malformed python_paths {python_paths!r}")
    if landlock is not None:
        ruleset = landlock.get("ruleset") if isinstance(landlock, dict) else None
        if not isinstance(ruleset, dict) or not all(
            type(ruleset.get(k)) is int for k in ("handled_fs", "handled_net", "scoped")
        ):
            raise ValueError("malformed landlock section")
        for rule in ruleset.get("rules", ()):
            if not (len(rule) == 2 and type(rule[0]) is str and type(rule[1]) is int):
                raise ValueError(f"malformed landlock rule {rule!r}")
        for rule in ruleset.get("net_rules", ()):
            if not (len(rule) == 2 and type(rule[0]) is int and type(rule[1]) is int):
                raise ValueError(f"malformed landlock net rule {rule!r}")
    if status_fd is not None and (type(status_fd) is not int or status_fd < 3):
        raise ValueError(f"malformed status_fd {status_fd!r}")
    for link in links:
        if not (len(link) == 2 and type(link[0]) is str and type(link[1]) is str):
            raise ValueError(f"malformed input link {link!r}")
    return landlock, status_fd, links, python_paths, display, bridge, ingress, supervised


def _close_inherited(keep: int | None) -> None:
    # bwrap hands the program whatever descriptors it did not mark close-on-exec; nothing but
    # stdio (and the status pipe, closed before the program starts) may reach it. The open ones
    # are listed rather than closed by range: a descriptor may sit above a lowered RLIMIT_NOFILE,
    # and os.closerange() falls back to one close() per number where close_range(2) is refused.
    try:
        fds: list[int] | range = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the numbers below the limit, at least
        fds = range(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            # Not contextlib.suppress: importing contextlib costs more than this whole function.
            try:  # noqa: SIM105
                os.close(fd)
            except OSError:  # the listing's own descriptor, gone already
                pass


class _Ffi:
    """The few C types and functions the boot calls, built on ``_ctypes`` (the C module) alone:
    the ``ctypes`` package defines hundreds of names when imported, about 3 ms on every run. Each
    function is declared with the exact C return type (an ``int`` result read as a ``long``
    would turn -1 into a large positive number)."""

    def __init__(self) -> None:
        import _ctypes

        simple = _ctypes._SimpleCData
        self.c_int = type("c_int", (simple,), {"_type_": "i"})
        self.c_long = type("c_long", (simple,), {"_type_": "l"})
        self.c_uint32 = type("c_uint32", (simple,), {"_type_": "I"})
        self.c_size_t = type("c_size_t", (simple,), {"_type_": "L"})  # LP64, as on every arch
        c_char_p = type("c_char_p", (simple,), {"_type_": "z"})
        c_void_p = type("c_void_p", (simple,), {"_type_": "P"})
        py_object = type("py_object", (simple,), {"_type_": "O"})
        self.get_errno = _ctypes.get_errno

        class _Process:  # what a CFuncPtr looks a symbol up in: an object with a dlopen handle
            # None: the process itself (libc and the interpreter), as ctypes.CDLL(None) opens.
            _handle = _ctypes.dlopen(None, os.RTLD_NOW | os.RTLD_LOCAL)  # type: ignore[arg-type]

        def function(name: str, flags: int, restype: Any, argtypes: Any = None) -> Any:
            attrs = {"_flags_": _ctypes.FUNCFLAG_CDECL | flags, "_restype_": restype}
            if argtypes is not None:
                attrs["_argtypes_"] = argtypes
            return type(f"_{name}", (_ctypes.CFuncPtr,), attrs)((name, _Process))

        errno_flag = _ctypes.FUNCFLAG_USE_ERRNO
        self.prctl = function("prctl", errno_flag, self.c_int)
        self.syscall = function("syscall", errno_flag, self.c_long)
        # Py_CompileStringExFlags(str, filename, start, flags, optimize): a new reference.
        self.compile_string = function(
            "Py_CompileStringExFlags",
            _ctypes.FUNCFLAG_PYTHONAPI,
            py_object,
            (c_char_p, c_char_p, self.c_int, c_void_p, self.c_int),
        )


_FFI: list[_Ffi] = []


def _ffi() -> _Ffi:
    if not _FFI:
        _FFI.append(_Ffi())
    return _FFI[0]


def _u64(*values: int) -> bytes:
    return b"".join(v.to_bytes(8, sys.byteorder) for v in values)


def _apply_landlock(landlock: dict[str, Any]) -> None:
    """Restrict this process, and everything it will start, to the compiled ruleset."""
    # Only here: a run without Landlock does not pay for the C calls' types.
    c = _ffi()
    syscall = c.syscall

    def check(result: int, what: str) -> int:
        if result < 0:
            err = c.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return result

    ruleset = landlock["ruleset"]
    fs, net, scoped = ruleset["handled_fs"], ruleset["handled_net"], ruleset["scoped"]
    file_rights = ruleset.get("file_rights", 0)
    # Landlock refuses to restrict a process that could gain privileges by execve; bwrap sets it
    # already, setting it again costs nothing and keeps the boot correct outside bwrap.
    zero = c.c_long(0)
    check(
        c.prctl(c.c_int(_PR_SET_NO_NEW_PRIVS), c.c_long(1), zero, zero, zero),
        "prctl(PR_SET_NO_NEW_PRIVS)",
    )
    # struct landlock_ruleset_attr grew with the ABI (fs; net at 4; scoped at 6): pass the
    # shortest prefix that carries what is set, which every kernel at least that new accepts.
    size = 24 if scoped else 16 if net else 8
    attr = _u64(fs, net, scoped)[:size]
    ruleset_fd = check(
        syscall(c.c_long(_SYS_CREATE_RULESET), attr, c.c_size_t(size), c.c_uint32(0)),
        "landlock_create_ruleset",
    )
    try:
        for path, rights in ruleset["rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # not mounted in this sandbox: nothing there to grant
            try:
                access = rights
                if os.fstat(fd).st_mode & _S_IFMT != _S_IFDIR:
                    access &= file_rights  # directory-only rights on a file are an EINVAL
                if access:
                    # struct landlock_path_beneath_attr is packed: __u64 allowed, __s32 fd.
                    rule = _u64(access) + fd.to_bytes(4, sys.byteorder, signed=True)
                    check(
                        syscall(
                            c.c_long(_SYS_ADD_RULE),
                            c.c_int(ruleset_fd),
                            c.c_int(_RULE_PATH_BENEATH),
                            rule,
                            c.c_uint32(0),
                        ),
                        f"landlock_add_rule({path})",
                    )
            finally:
                os.close(fd)
        for port, rights in ruleset.get("net_rules", ()):
            # struct landlock_net_port_attr: __u64 allowed_access, __u64 port.
            check(
                syscall(
                    c.c_long(_SYS_ADD_RULE),
                    c.c_int(ruleset_fd),
                    c.c_int(_RULE_NET_PORT),
                    _u64(rights, port),
                    c.c_uint32(0),
                ),
                f"landlock_add_rule(tcp port {port})",
            )
        check(
            syscall(c.c_long(_SYS_RESTRICT_SELF), c.c_int(ruleset_fd), c.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset_fd)


def _compile(source: bytes, filename: str) -> Any:
    """``compile(source, filename, "exec", dont_inherit=True)``, but cheaper where it can be.

    The first call of the builtin ``compile`` in a process builds the ``ast`` module's hundred
    classes (it checks whether its argument is an AST), 1.5 ms that ``python script.py`` never
    spends. When ``_ctypes`` is loaded already (Landlock was applied, or a preloaded module
    imported ctypes), the C function the interpreter itself uses is called instead: same
    parser, coding cookie honoured, no inherited future flags.
    """
    # A NUL would end the C string early; the builtin reports it properly.
    if "_ctypes" in sys.modules and sys.implementation.name == "cpython" and b"\0" not in source:
        return _ffi().compile_string(source, os.fsencode(filename), _PY_FILE_INPUT, None, -1)
    return compile(source, filename, "exec", dont_inherit=True)


def _report(exc: BaseException, tb: Any) -> None:
    # What the interpreter does with an uncaught exception, minus the boot's own frames.
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:
        sys.__excepthook__(type(exc), exc, tb)


def _load_display(module_path: str) -> Any:
    """The display module (``_display.py``, shipped compiled), as a module of its own that
    stays out of ``sys.modules``. The frozen importlib's loader checks the .pyc header."""
    name = "_sandcell_display"
    loader = sys.modules["_frozen_importlib_external"].SourcelessFileLoader(name, module_path)
    module = type(sys)(name)
    exec(loader.get_code(name), module.__dict__)  # noqa: S102 - sandcell's own module
    return module


def _run_displayed(display: tuple[Any, str], source: bytes, ns: dict[str, Any], path: str) -> None:
    """The program as one notebook cell (``_display.run_cell``): the value of a last expression
    and open figures are written as outputs; statuses and tracebacks as in ``_run_python``."""
    module, out_dir = display
    try:
        # The host writes the program as UTF-8; run_cell parses text, so the cookie is moot.
        module.run_cell(source.decode("utf-8-sig"), ns, out_dir, filename=path)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # Without the boot's and run_cell's frames; a syntax error gets no traceback at all.
        _report(exc, module.user_traceback(exc.__traceback__))
        raise SystemExit(1) from None


_REPLACED_STDIO: list[Any] = []


def _write_all_file(fd: int) -> Any:
    """A raw file on ``fd`` whose ``write`` writes everything it is given: a pipe may take less
    than a large write (gVisor's took 64 KiB of a longer line), and a ``TextIOWrapper`` over a
    raw file drops what a write did not take."""
    import io

    class WriteAll(io.FileIO):
        def write(self, b: Any) -> int:
            view = memoryview(b).cast("B")
            total = len(view)
            while view:
                n = super().write(view)
                if n is None:  # a full non-blocking pipe: wait until it takes more
                    import select

                    select.select([], [self], [])
                    continue
                view = view[n:]
            return total

    return WriteAll(fd, "w", closefd=False)


def _unbuffered_stdio() -> None:
    """What ``PYTHONUNBUFFERED`` (set by every runtime) does for an interpreter started without
    ``-I``, which ignores it: stdout and stderr write through to their descriptors, so the host
    reads each write as the program makes it (live output, and the two streams in order)."""
    if not os.environ.get("PYTHONUNBUFFERED"):
        return
    import io  # already loaded by the interpreter's own startup: costs nothing

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if old is None or getattr(old, "write_through", False):
            continue
        try:
            old.flush()
        except Exception:  # noqa: S112 - a closed or broken stream stays as it is
            continue
        new = io.TextIOWrapper(
            _write_all_file(fd),
            encoding=old.encoding,
            errors=old.errors,
            write_through=True,
        )
        _REPLACED_STDIO.append(old)  # kept: never finalised behind the program's back
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _run_python(script: str, args: list[str], display: tuple[Any, str] | None = None) -> None:
    """Run ``script`` in this process as ``__main__``, as ``python script args...`` would; with
    ``display`` (the display module and output directory), as a notebook cell."""
    _unbuffered_stdio()
    main_file = os.path.abspath(script)  # Python >= 3.9 makes __main__.__file__ absolute
    boot = sys.argv[0]
    orig = getattr(sys, "orig_argv", None)
    if orig is not None:
        # [python, options..., boot, plan, mode, script, args...] -> [python, options..., script,
        # args...]: the program sees the command line it would have had without the boot.
        sys.orig_argv = [*orig[: len(orig) - len(sys.argv)], script, *args]
    sys.argv = [script, *args]
    # Without -I/-P the interpreter puts the script's directory first: the script's, not ours.
    safe_path = sys.flags.isolated or getattr(sys.flags, "safe_path", False)
    if not safe_path and sys.path and sys.path[0] == os.path.dirname(os.path.realpath(boot)):
        sys.path[0] = os.path.dirname(os.path.realpath(script))

    try:
        with open(script, "rb") as f:
            source = f.read()
    except OSError as exc:
        sys.stderr.write(
            f"{sys.executable}: can't open file {main_file!r}: [Errno {exc.errno}] {exc.strerror}\n"
        )
        raise SystemExit(2) from None

    # A fresh module, with the names and order of the interpreter's own __main__; the boot's
    # globals stay in the boot's module, which leaves sys.modules.
    main = type(sys)("__main__")
    ns = main.__dict__
    ns["__annotations__"] = {}
    ns["__builtins__"] = sys.modules["builtins"]
    ns["__file__"] = main_file
    ns["__cached__"] = None
    loader_type = sys.modules["_frozen_importlib_external"].SourceFileLoader
    ns["__loader__"] = loader_type("__main__", main_file)
    sys.modules["__main__"] = main
    if display is not None:
        _run_displayed(display, source, ns, main_file)
        return

    failed = False
    try:
        # Nothing inherited: the boot's `from __future__ import annotations` must not leak into
        # the program. Bytes, so that the coding cookie and BOM are honoured as by the interpreter.
        code = _compile(source, main_file)
    except Exception as exc:  # SyntaxError and the like: reported without a traceback
        _report(exc, None)
        failed = True
    else:
        del source
        try:
            exec(code, ns)  # noqa: S102 - running the program is the point
        except (SystemExit, KeyboardInterrupt):
            # The interpreter's handling applies as is: status, message, re-raised SIGINT.
            raise
        except BaseException as exc:
            tb = exc.__traceback__
            _report(exc, tb.tb_next if tb is not None else None)
            failed = True
    if failed:
        raise SystemExit(1)


def _supervise(child: int, status_fd: int) -> NoReturn:
    """Wait for the program, report its raw wait status, and exit as it did. (A child that
    failed before it started wrote no "started" byte; its exit status 125 says why.)

    The cold path starts the boot as the sandbox's pid 1 (bwrap ``--as-pid-1``): orphans of the
    run are reparented here, so every child is reaped, not only the program (a zombie still
    counts against the run's process limit). As pid 1 it gets only the signals it handles from
    inside its namespace; the interpreter's SIGINT handler is removed, so none reaches it."""
    import _signal  # type: ignore[import-not-found]  # `signal` imports enum: milliseconds

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(_BOOT_FAILED)
        if pid == child:
            break
    try:  # noqa: SIM105 - contextlib costs more than the whole boot
        os.write(status_fd, f"W{status}\n".encode())
    except OSError:  # the supervisor is gone; the exit status below still tells
        pass
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _exec(argv: list[str]) -> NoReturn:
    try:
        os.execv(argv[0], argv)  # an argv, no shell involved
    except OSError as exc:
        # The shells' statuses: 127 not found, 126 found but not executable.
        os.write(2, f"sandcell-boot: exec {argv[0]}: {exc}\n".encode("utf-8", "backslashreplace"))
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _restrict(landlock: dict[str, Any] | None) -> None:
    if landlock is None:
        return
    try:
        _apply_landlock(landlock)
    except Exception as exc:
        if landlock.get("required", True):
            _fail(f"landlock: {exc}")
        warning = f"sandcell-boot: landlock: {exc}; running without it\n"
        os.write(2, warning.encode("utf-8", "backslashreplace"))


def _start_bridge(argv: list[str], status_fd: int | None, what: str = "egress bridge") -> None:
    """Run the script ``argv[0]`` with ``argv[1:]`` (the egress bridge) in a child, as
    ``python -I SCRIPT ARGS`` would, and return once it printed its one line (the port it
    listens on), or fail the boot. The child is forked here, before the program and outside
    its Landlock domain (whose signal scope then keeps the program from stopping it); as a
    child of the sandbox's pid 1 it dies with the sandbox, and it carries the run's rlimits and
    cgroup. An interpreter of its own would cost some 20 ms per run; the boot is one already."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = _BOOT_FAILED
        try:
            os.close(read_end)
            if status_fd is not None:
                os.close(status_fd)
            # Its line goes to the boot, never into the program's output.
            os.dup2(write_end, 1)
            os.close(write_end)
            with open(argv[0], "rb") as f:
                source = f.read()
            sys.argv = list(argv)
            ns: dict[str, Any] = {"__name__": "__main__", "__file__": argv[0]}
            ns["__builtins__"] = sys.modules["builtins"]
            exec(compile(source, argv[0], "exec", dont_inherit=True), ns)  # noqa: S102
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            message = f"sandcell-boot: {what}: {exc}\n"
            try:  # noqa: SIM105
                os.write(2, message.encode("utf-8", "backslashreplace"))
            except OSError:
                pass
        os._exit(status)
    os.close(write_end)
    line = b""
    while not line.endswith(b"\n"):
        try:
            chunk = os.read(read_end, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        line += chunk
    os.close(read_end)
    if not line.strip().isdigit():
        _fail(f"the {what} did not start (it said {line!r})")


def _started(status_fd: int) -> None:
    # "Started", written right before the program, which cannot have printed anything yet;
    # then the descriptor is closed, so the program never holds it.
    try:
        os.write(status_fd, b"1")
        os.close(status_fd)
    except OSError as exc:
        _fail(f"status descriptor {status_fd}: {exc}")


def _make_links(links: list[list[str]]) -> None:
    for link, link_target in links:
        try:
            os.symlink(link_target, link)
        except OSError as exc:
            _fail(f"input link {link} -> {link_target}: {exc}")


_TERMINATING = (1, 2, 3, 10, 12, 14, 15)
"""SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM (numbers: `signal` imports enum)."""


def _default_signals() -> None:
    """Undo what the caller's environment ignored: ``nohup`` ignores SIGHUP, a shell's
    background job SIGINT and SIGQUIT, and an ignored signal stays ignored across fork and exec.
    A sandboxed program (and every process it starts) meets each signal as on a fresh login,
    whoever started sandcell and how: SIGINT raises KeyboardInterrupt in Python, the others take
    their default action."""
    import _signal  # `signal` imports enum: milliseconds

    for number in _TERMINATING:
        if _signal.getsignal(number) == _signal.SIG_IGN:
            default = _signal.default_int_handler if number == 2 else _signal.SIG_DFL
            _signal.signal(number, default)


def _main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] not in ("python", "exec"):
        _fail("usage: boot.py PLAN (python SCRIPT | exec PROGRAM) [ARGS...]")
    _default_signals()
    plan_path, mode, target = argv[1], argv[2], argv[3:]
    try:
        plan = _load_plan(plan_path)
        landlock, status_fd, links, python_paths, display_plan, bridge, ingress, supervised = plan
    except Exception as exc:
        _fail(f"cannot read the plan {plan_path}: {exc}")
    display: tuple[Any, str] | None = None
    if display_plan is not None and mode == "python":
        try:
            display = (_load_display(display_plan["module"]), display_plan["dir"])
        except Exception as exc:
            _fail(f"cannot load the display module {display_plan['module']}: {exc}")

    _close_inherited(status_fd)
    # Packages from the wheel cache: after the runtime's own site-packages, so they add modules
    # but never shadow the runtime's.
    sys.path.extend(python_paths)
    if bridge is not None:
        _start_bridge(bridge, status_fd)
    if ingress is not None:
        _start_bridge(ingress, status_fd, "ingress agent")
    if status_fd is None or supervised:
        # Supervised: the sandbox's pid 1 (the native init, outside the program's Landlock
        # domain) waits for this process and reports how it ended; the program runs here.
        _restrict(landlock)
        _make_links(links)
        if status_fd is not None:
            _started(status_fd)
    else:
        # The program runs in a child; this process stays, trusted and idle, to report how the
        # program really ended (an exit status of 137 and death by SIGKILL look the same to
        # bwrap). The status descriptor never reaches the program.
        # Frozen, the boot's objects stay out of the child's garbage collections, whose
        # reference-count writes would otherwise copy their pages (a few ms per run).
        import gc

        gc.freeze()
        child = os.fork()
        if child:
            _supervise(child, status_fd)
        # Landlock in the child only: the supervising parent stays outside the program's
        # domain, so the domain's signal scope keeps the program from killing it.
        _restrict(landlock)
        _make_links(links)
        _started(status_fd)

    if mode == "exec":
        _exec(target)
    _run_python(target[0], target[1:], display)


if __name__ == "__main__":
    _main(sys.argv)
