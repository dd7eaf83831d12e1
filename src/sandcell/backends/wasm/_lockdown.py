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
import gc
import linecache
import os
import sys
import traceback
from typing import Any

_JS_MODULES = ("js", "pyodide_js", "pyodide", "_pyodide", "_pyodide_core", "micropip")
_NATIVE = ("ctypes", "_ctypes")
_COMPILED = (
    "numpy", "pandas", "scipy", "matplotlib", "sklearn", "torch", "polars", "pyarrow", "lxml",
    "PIL", "cv2", "shapely", "statsmodels",
)  # fmt: skip
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
    jsproxy_type = None
    js = sys.modules.get("js")
    if js is not None:
        jsproxy_type = type(js)
    for name in list(sys.modules):
        if _root(name) in _JS_MODULES + _NATIVE:
            del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if "pyodide" not in _module_of(f)]
    sys.meta_path.insert(0, _Refuse())
    sys.path_importer_cache.clear()
    for hook in list(sys.path_hooks):
        if "pyodide" in _module_of(hook):
            sys.path_hooks.remove(hook)
    # Emscripten's os.system and the process calls fail with ENOSYS already; say so plainly.
    for name in ("system", "fork", "forkpty", "execv", "execve", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            delattr(os, name)
    if jsproxy_type is not None:
        del js
        gc.collect()
        for obj in gc.get_objects():
            if isinstance(obj, jsproxy_type):
                raise SystemExit("sandcell-wasm: a JavaScript object is still reachable")
            for ref in gc.get_referents(obj):
                if isinstance(ref, jsproxy_type):
                    raise SystemExit(
                        "sandcell-wasm: a JavaScript object is still reachable from "
                        f"{type(obj).__name__}"
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
    def __init__(self, env: dict[str, str]) -> None:
        # The snapshot's environment is Pyodide's build host's: the run's replaces it.
        os.environ.clear()
        os.environ.update(env)
        self.main_ns = sys.modules["__main__"].__dict__
        self.scopes: dict[str, dict[str, Any]] = {}

    def run_program(self, path: str) -> int:
        with open(path, encoding="utf-8") as f:
            code = f.read()
        return self.run_text(code, path)

    def program_cell(self, cell_id: int, code: str, filename: str) -> dict[str, Any]:
        """A pooled sandbox's one program, replied to as a cell: its exit status, and the
        exception that ended it (a MemoryError is the heap's maximum)."""
        status, error = self.run_program_text(code, filename)
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
        try:
            exec(compile(code, filename, "exec", dont_inherit=True), self.main_ns)  # noqa: S102
        except SystemExit as exc:
            status = _exit_status(exc)
        except BaseException as exc:
            _print_exception(exc, 1)
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
        reply = {"op": "done", "id": cell_id}
        try:
            exec(compile(code, filename, "exec", dont_inherit=True), ns)  # noqa: S102
            reply["status"] = "ok"
        except KeyboardInterrupt as exc:
            reply["status"] = "interrupted"
            _print_exception(exc, 1)
        except SystemExit as exc:
            reply["status"] = "exit"
            reply["exit_code"] = _exit_status(exc)
        except BaseException as exc:
            reply["status"] = "error"
            reply["error"] = type(exc).__name__
            _print_exception(exc, 1)
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


_lock()
# Set by the runner in this namespace before it runs this file.
sys.path.extend(globals().pop("_sandcell_paths"))  # wheel-cache packages, after the stdlib
_sandcell_driver = _Driver(globals().pop("_sandcell_env"))
del _lock, _Driver
