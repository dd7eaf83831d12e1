"""Inside Pyodide, before the program: cut every way from Python to JavaScript, then run it.

Run by ``_runner.mjs`` (``runPython``) in the interpreter the program will use; standalone, it
imports nothing of sandcell. It leaves ``_sandcell_driver`` in ``__main__``'s globals (the runner
takes it and deletes the name) with the calls the runner makes: ``run_program``, ``run_text``,
``run_cell`` and ``drop_scope``.

The lockdown: the modules that reach JavaScript (``js``, ``pyodide_js``, ``pyodide`` and its
submodules, ``_pyodide``, ``_pyodide_core``, ``micropip``) are removed from ``sys.modules``, the
import machinery's finder for JavaScript modules is taken out, and a finder placed first refuses
them, ``ctypes`` (it would call into the runtime's own functions) and the compiled packages the
rung cannot load (numpy, pandas...) with a message that names the rungs that have them. Then the
heap is searched for a JavaScript object still reachable from Python: if one is, the runner
refuses to start (fail closed). The finder is an ordinary object the program could remove; what
it guards is gone either way (the modules' objects are unreachable, checked), so removing it
gains nothing but the re-import of a module whose JavaScript side is the empty ``jsglobals``.
"""

import builtins
import contextlib
import errno
import gc
import linecache
import os
import shutil
import sys
import traceback
from typing import Any, NoReturn

_JS_MODULES = ("js", "pyodide_js", "pyodide", "_pyodide", "_pyodide_core", "micropip")
_NATIVE = ("ctypes", "_ctypes")
_COMPILED: frozenset[str] = frozenset()
"""Compiled packages the rung refuses, with the rungs that have them: the host's list
(``capabilities.COMPILED_MODULES``), set from the runner's settings before the lockdown."""
_RUNGS_WITH_THEM = "namespaces, gvisor or microvm"


def _root(name: str) -> str:
    return name.partition(".")[0]


class _Refuse:
    """The first finder: an ImportError that says why for what the rung does not offer."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        root = _root(name)
        if root in _JS_MODULES:
            raise ImportError(
                f"{name} is not available on the wasm rung: the program has no way to "
                "JavaScript or to Node.js",
                name=name,
            )
        if root in _NATIVE:
            raise ImportError(
                f"{name} is not available on the wasm rung: it would call native code",
                name=name,
            )
        if root in _COMPILED:
            raise ImportError(
                f"{name} is not available on the wasm rung (it runs the standard library and "
                f"pure-Python packages only); run it on the {_RUNGS_WITH_THEM} rung "
                "(--backend)",
                name=name,
            )

    def find_module(self, name: str, path: object = None) -> None:  # older callers
        self.find_spec(name, path)


def _module_of(finder: object) -> str:
    owner = finder if isinstance(finder, type) else type(finder)
    return getattr(owner, "__module__", "") or ""


def _lock() -> None:
    # The proxy class JavaScript objects appear as, taken before its module goes: the scan at
    # the end needs it (none found would make the scan vacuous, so that stops the start).
    from pyodide.ffi import JsProxy  # type: ignore[import-not-found]

    proxy_meta = type(JsProxy)
    for name in list(sys.modules):
        if _root(name) in _JS_MODULES + _NATIVE:
            del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if "pyodide" not in _module_of(f)]
    sys.meta_path.insert(0, _Refuse())
    sys.path_importer_cache.clear()
    for hook in list(sys.path_hooks):
        if "pyodide" in _module_of(hook):
            sys.path_hooks.remove(hook)
    # Emscripten's system() would ask Node for a child process (refused, fatally for the run):
    # every way to a process fails as on a system without them, with ENOSYS and the reason.
    for name in ("system", "fork", "forkpty", "execv", "execve", "posix_spawn", "posix_spawnp",
                 "spawnv", "spawnve", "popen"):  # fmt: skip
        if hasattr(os, name):
            setattr(os, name, _no_processes)
    _no_asyncio()
    _unlink_javascript(proxy_meta, (JsProxy,))
    _interruptible_sleep()


def _no_asyncio() -> None:
    """asyncio.run says why it cannot run here instead of failing inside Pyodide."""
    import asyncio

    # Pyodide's event loop schedules through JavaScript, and the standard one needs a socket
    # pair Pyodide makes with a JavaScript WebSocket: asyncio cannot run here; say so.
    asyncio.set_event_loop_policy(None)
    asyncio.events._set_running_loop(None)  # Pyodide set its loop running

    def run(main: object, **_: object) -> None:
        close = getattr(main, "close", None)
        if close is not None:
            close()
        raise RuntimeError(
            "asyncio's event loop is not available on the wasm rung (Pyodide's runs on "
            f"JavaScript); run asyncio programs on the {_RUNGS_WITH_THEM} rung (--backend)"
        )

    asyncio.run = run  # type: ignore[assignment]
    asyncio.runners.run = run  # type: ignore[assignment]


def _interruptible_sleep() -> None:
    """time.sleep in slices: Pyodide sees an interrupt (a cell's wall time, a cancel) only
    between bytecodes, and one long sleep would hold it off until it returns."""
    import time

    whole = time.sleep

    def sleep(secs: float) -> None:
        if not isinstance(secs, int | float) or secs <= 0.05:
            whole(secs)  # its own errors for other types and negative lengths
            return
        end = time.monotonic() + secs
        while (left := end - time.monotonic()) > 0:
            whole(min(left, 0.05))

    sleep.__doc__ = whole.__doc__
    time.sleep = sleep  # type: ignore[assignment]


class _KernelExit(BaseException):
    """``os._exit`` in a kernel: the cell's end, then the kernel's with that status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _no_processes(*args: object, **kwargs: object) -> NoReturn:
    raise OSError(errno.ENOSYS, "the wasm rung has no processes")


def _unlink_javascript(proxy_meta: type, bases: tuple[type, ...]) -> None:
    """Drop every reference Python code could follow to a JavaScript object. Pyodide's own
    modules (gone from ``sys.modules``, alive while JavaScript holds their functions) keep
    proxies in their globals and in instances (the web event loop, the package loader); every
    class of proxy has the one metaclass ``proxy_meta`` or derives from one of ``bases``. A
    dict, list or instance that holds one loses it; a proxy held by anything else, or one still
    found after that, stops the start."""
    # The classes first (heap types, tracked): then each object's referents are tested as a set
    # of types, in C, not one by one in Python (a pass over ~19,000 objects here).
    proxy_types = {
        o
        for o in gc.get_objects()
        if isinstance(o, type) and (type(o) is proxy_meta or issubclass(o, bases))
    }
    for _ in range(3):
        gc.collect()
        found = False
        for obj in gc.get_objects():
            refs = gc.get_referents(obj)
            if type(obj) in proxy_types or proxy_types.isdisjoint(map(type, refs)):
                continue  # a proxy is reached through what holds it
            found = True
            _drop_proxies(obj, [r for r in refs if type(r) in proxy_types])
        if not found:
            return
    raise SystemExit("sandcell-wasm: JavaScript objects stay reachable after the lockdown")


def _drop_proxies(holder: object, proxies: list[object]) -> None:
    for ref in proxies:
        if isinstance(holder, dict):
            for key in [k for k, v in holder.items() if v is ref]:
                holder[key] = None
        elif isinstance(holder, list):
            holder[:] = [v for v in holder if v is not ref]
        elif hasattr(holder, "__dict__") and not isinstance(holder, type):
            for key, value in list(vars(holder).items()):
                if value is ref:
                    setattr(holder, key, None)
        else:
            raise SystemExit(
                f"sandcell-wasm: a JavaScript object stays reachable from a {type(holder).__name__}"
            )


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _print_exception(exc: BaseException, skip: int) -> None:
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream has nothing left
            stream.flush()


class _Driver:
    def __init__(self, env: dict[str, str], display: list[str] | None) -> None:
        # The snapshot's environment is Pyodide's build host's: the run's replaces it.
        os.environ.clear()
        os.environ.update(env)
        self.main_ns = sys.modules["__main__"].__dict__
        self.scopes: dict[str, dict[str, Any]] = {}
        self.display: Any = None
        self.display_dir = ""
        self.seq = 0
        if display is not None:
            source, path, self.display_dir = display
            module = type(sys)("_sandcell_display")
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
            self.display = module

    def _execute(self, code: str, filename: str, ns: dict[str, Any], out_dir: str | None) -> None:
        """``code`` in ``ns``: as a notebook cell writing its outputs into ``out_dir`` when the
        display module is loaded, else plainly."""
        if self.display is None or out_dir is None:
            exec(compile(code, filename, "exec", dont_inherit=True), ns)  # noqa: S102
            return
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        self.seq = self.display.run_cell(code, ns, out_dir, filename=filename, seq_start=self.seq)

    def _report(self, exc: BaseException) -> None:
        if self.display is not None:
            tb = self.display.user_traceback(exc.__traceback__)
            traceback.print_exception(type(exc), exc, tb)
        else:
            _print_exception(exc, 2)

    def kernel_exits(self) -> None:
        """In a kernel (a session's, a pooled sandbox's): ``os._exit`` ends the kernel with its
        status once the cell's frames are gone. Emscripten's own exit does not return from a
        worker thread, where a kernel's interpreter runs."""

        def _exit(status: int) -> None:
            raise _KernelExit(int(status) & 0xFF)

        os._exit = _exit  # type: ignore[assignment]

    def run_program(self, path: str) -> int:
        with open(path, encoding="utf-8") as f:
            code = f.read()
        return self.run_text(code, path)

    def program_cell(self, cell_id: int, code: str, filename: str) -> dict[str, Any]:
        """A pooled sandbox's one program, replied to as a cell: its exit status, and the
        exception that ended it (a MemoryError is the heap's maximum)."""
        try:
            status, error = self.run_program_text(code, filename)
        except _KernelExit as exc:
            return {"op": "exit", "status": exc.status}
        reply = {"op": "done", "id": cell_id, "status": "exit", "exit_code": status}
        if error == "KeyboardInterrupt":  # the host's interrupt: its wall time or a cancel
            reply["status"] = "interrupted"
        elif error is not None:
            reply.update(status="error", error=error)
        return reply

    def run_text(self, code: str, filename: str) -> int:
        """The program as ``python FILE`` runs it: a fresh ``__main__``, its exit status."""
        return self.run_program_text(code, filename)[0]

    def run_program_text(self, code: str, filename: str) -> tuple[int, str | None]:
        """:meth:`run_text`'s exit status, and the exception that ended the program."""
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = {"__name__": "__main__", "__file__": filename, "__builtins__": builtins}
        self.main_ns.clear()
        self.main_ns.update(ns)
        status, error = 0, None
        out_dir = self.display_dir if self.display is not None else None
        try:
            self._execute(code, filename, self.main_ns, out_dir)
        except SystemExit as exc:
            status = _exit_status(exc)
        except _KernelExit:
            raise
        except BaseException as exc:
            self._report(exc)
            status, error = 1, type(exc).__name__
        _flush()
        return status, error

    def run_cell(
        self, cell_id: int, code: str, scope: str | None, cwd: str | None
    ) -> dict[str, Any]:
        filename = f"<cell {cell_id}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = self.main_ns
        home = None
        if scope is not None:
            entry = self.scopes.get(scope)
            if entry is None:
                entry = self.scopes[scope] = {
                    "ns": {"__name__": "__main__", "__builtins__": builtins},
                    "cwd": cwd,
                }
            ns = entry["ns"]
            try:
                home = os.getcwd()
                if entry["cwd"] is not None:
                    os.chdir(entry["cwd"])
            except OSError as exc:
                _print_exception(exc, 99)
                return {"op": "done", "id": cell_id, "status": "error", "error": type(exc).__name__}
        out_dir = None
        if self.display is not None:
            # The host has read the last cell's outputs: only this cell's are kept.
            shutil.rmtree(self.display_dir, ignore_errors=True)
            out_dir = f"{self.display_dir}/{cell_id}"
        reply: dict[str, Any] = {"op": "done", "id": cell_id, "out_dir": out_dir}
        try:
            self._execute(code, filename, ns, out_dir)
            reply["status"] = "ok"
        except KeyboardInterrupt as exc:
            reply["status"] = "interrupted"
            self._report(exc)
        except SystemExit as exc:
            reply["status"] = "exit"
            reply["exit_code"] = _exit_status(exc)
        except _KernelExit as exc:
            _flush()
            return {"op": "exit", "status": exc.status}
        except BaseException as exc:
            reply["status"] = "error"
            reply["error"] = type(exc).__name__
            self._report(exc)
        finally:
            if scope is not None:
                try:
                    self.scopes[scope]["cwd"] = os.getcwd()
                    if home is not None:
                        os.chdir(home)
                except OSError:
                    pass
        _flush()
        return reply

    def drop_scope(self, name: str) -> None:
        self.scopes.pop(name, None)


# Only where the runner ran this file, having set these names first: imported anywhere else (the
# host's checks import every module), it locks nothing down.
if "_sandcell_env" in globals():
    _COMPILED = frozenset(globals().pop("_sandcell_compiled"))
    _lock()
    sys.path.extend(globals().pop("_sandcell_paths"))  # wheel-cache packages, after the stdlib
    _sandcell_driver = _Driver(globals().pop("_sandcell_env"), globals().pop("_sandcell_display"))
    del _lock, _Driver
