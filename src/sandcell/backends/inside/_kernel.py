"""sandcell kernel: the long-lived interpreter of a session, inside its sandbox.

Usage (inside the sandbox, started by the boot after Landlock is applied, never by hand)::

    python -I /sandcell/kernel.pyc [--path DIR]... [--display /sandcell/display.pyc]
        [--outputs DIR]

The host hands the kernel one end of a socket pair as its standard input. The kernel takes it over
as its control channel (and puts ``/dev/null`` on fd 0 for the cells), says hello, then serves
cell requests one at a time until the channel closes:

* host to kernel: ``{"op": "cell", "id": N, "code": TEXT, "scope": NAME, "cwd": PATH}``
  (``scope`` and ``cwd`` optional), or ``{"op": "drop", "id": N, "scope": NAME}``
* kernel to host: ``{"op": "hello", "pid": PID, "display": BOOL}`` once, then for each cell
  ``{"op": "started", "id": N}`` as it starts the cell's code (not for a drop, nor a scope
  whose directory is gone), then
  ``{"op": "done", "id": N, "status": "ok"|"error"|"interrupted"|"exit", "error": TYPE,
  "exit_code": CODE, "out_dir": PATH|null}`` (for a drop: ``{"op": "done", "id": N, "status":
  "ok"}``)

Each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON. Every cell runs in
this process, in one ``__main__`` namespace, so variables and imports persist. A cell with a
``scope`` runs in that scope's own namespace instead (made empty, as a fresh ``__main__``, by its
first cell), and in the scope's own working directory: ``cwd`` when its first cell gave one, else
the kernel's at that moment; whatever directory a cell of the scope ends in is the scope's next,
and the kernel's own is put back after every such cell. ``drop`` forgets a scope (its next cell
starts it afresh). Scopes share everything else in the process: imported modules
(``sys.modules``), ``os.environ``, open files, threads. Cell output goes to
fds 1 and 2, which are flushed before the reply, so everything a cell printed is in the host's
pipes before its reply arrives. With a display module (``_display.py``, precompiled), cells run
through its ``run_cell``: the last expression's value and open figures become manifest files in a
per-cell directory under ``/tmp`` that the host collects (``--outputs``: under another directory,
one the host can read, such as the workspace of a sandbox whose ``/tmp`` the host cannot see).

SIGINT interrupts the running cell (KeyboardInterrupt, state kept); between cells it is ignored,
so an interrupt that races the end of a cell cannot kill the kernel. The kernel says
``{"op": "started", "id": N}`` once a SIGINT would interrupt cell N: the host interrupts a cell
once, after that message, never before it (where the SIGINT would be lost).

This file is standalone on purpose: it runs inside the sandbox and must not import sandcell.

Security limitations: the kernel shares its process with the untrusted cells, which can read and
write its control channel, replace its functions or exit. Nothing it reports is trusted by the
host beyond framing and shape: the host bounds message sizes, enforces time limits with signals
and the session's limits with the kernel (cgroups, rlimits), never with this code's cooperation.
"""

from __future__ import annotations

import json
import linecache
import os
import signal
import stat
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_MAX_MESSAGE = 64 * 1024 * 1024
_OUTPUTS_ROOT = "/tmp/.sandcell-outputs"
_KERNEL_FILE = "/sandcell/kernel.py"


class _State:
    in_cell = False
    replaced: list[Any] = []  # noqa: RUF012 - one kernel per process


def _on_sigint(signum: int, frame: object) -> None:
    # Only a running cell is interrupted; the kernel's own loop never sees KeyboardInterrupt.
    if _State.in_cell:
        raise KeyboardInterrupt


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv(fd: int) -> dict[str, Any] | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > _MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is too large")
    body = _read_exact(fd, size)
    if body is None:
        return None
    msg = json.loads(body.decode("utf-8"))
    if not isinstance(msg, dict):
        raise ValueError("message is not an object")
    return msg


def _send(fd: int, msg: dict[str, Any]) -> None:
    body = json.dumps(msg).encode("utf-8")
    data = len(body).to_bytes(4, "big") + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _load_display(path: str) -> Any:
    """The precompiled display module (``_display.py``), as a module of its own that stays out
    of ``sys.modules`` (as the boot loads it); None when it is not shipped."""
    if not os.path.exists(path):
        return None
    name = "_sandcell_display"
    # The frozen importlib's loader checks the .pyc header (magic number) for us.
    loader = sys.modules["_frozen_importlib_external"].SourcelessFileLoader(name, path)
    module = type(sys)(name)
    exec(loader.get_code(name), module.__dict__)  # noqa: S102 - sandcell's own module
    return module


def _remove_tree(path: str) -> None:
    # A cell may have put a link or a file where the outputs directory goes: it goes, and what
    # it pointed at stays (the next cell's directory is then made fresh, not under the link).
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return
    if not is_dir:
        try:  # noqa: SIM105
            os.unlink(path)
        except OSError:
            pass
        return
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(entry.path)
        else:
            try:  # noqa: SIM105 - a cell may have removed it already
                os.unlink(entry.path)
            except OSError:
                pass
    try:  # noqa: SIM105
        os.rmdir(path)
    except OSError:
        pass


def _print_exception(exc: BaseException, filename: str) -> None:
    # What a notebook shows: the cell's own frames (and what they called), not the kernel's or
    # the display module's, and for a syntax error no traceback at all.
    try:
        frames = [] if isinstance(exc, SyntaxError) else traceback.extract_tb(exc.__traceback__)
        while frames and frames[0].filename != filename:
            frames.pop(0)
        frames = [f for f in frames if f.filename != _KERNEL_FILE]
        text = ""
        if frames:
            text = "Traceback (most recent call last):\n"
            text += "".join(traceback.StackSummary.from_list(frames).format())
        text += "".join(traceback.format_exception_only(type(exc), exc))
        sys.stderr.write(text)
    except BaseException:
        os.write(2, f"{type(exc).__name__}\n".encode())


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
    ``-I``, which ignores it: a cell's output reaches the host as it is written, not only when
    the cell ends (live output). The same as the boot's."""
    if not os.environ.get("PYTHONUNBUFFERED"):
        return
    import io  # already loaded by the interpreter's own startup

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if old is None or getattr(old, "write_through", False):
            continue
        old.flush()
        new = io.TextIOWrapper(
            _write_all_file(fd),
            encoding=old.encoding,
            errors=old.errors,
            write_through=True,
        )
        _State.replaced.append(old)  # kept: never finalised behind the cells' back
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # noqa: S110 - a cell may have closed or replaced them
            pass


def _fresh_main() -> dict[str, Any]:
    """An empty namespace as a script's ``__main__`` starts with."""
    return {"__name__": "__main__", "__builtins__": sys.modules["builtins"], "__annotations__": {}}


class _Scope:
    """One named namespace and the directory its cells run in (None: the kernel's)."""

    def __init__(self, cwd: str | None) -> None:
        self.ns = _fresh_main()
        self.cwd = cwd


class Kernel:
    """Runs cells in one namespace, or in named scopes; see the module docstring."""

    def __init__(self, ctl: int, display: Any, outputs_root: str = _OUTPUTS_ROOT) -> None:
        self.ctl = ctl
        self.outputs_root = outputs_root
        self.run_cell: Callable[..., int] | None = display.run_cell if display is not None else None
        self.seq = 0
        main = type(sys)("__main__")
        ns = main.__dict__
        ns["__annotations__"] = {}
        ns["__builtins__"] = sys.modules["builtins"]
        sys.modules["__main__"] = main
        self.ns: dict[str, Any] = ns
        self.scopes: dict[str, _Scope] = {}

    def serve(self) -> None:
        _send(self.ctl, {"op": "hello", "pid": os.getpid(), "display": self.run_cell is not None})
        while True:
            msg = _recv(self.ctl)
            if msg is None:
                return
            op, scope, cwd = msg.get("op"), msg.get("scope"), msg.get("cwd")
            if (
                op == "cell"
                and isinstance(msg.get("code"), str)
                and (scope is None or isinstance(scope, str))
                and (cwd is None or isinstance(cwd, str))
            ):
                reply = self.scoped_cell(int(msg.get("id", 0)), msg["code"], scope, cwd)
            elif op == "drop" and isinstance(scope, str):
                self.scopes.pop(scope, None)
                reply = {"op": "done", "id": msg.get("id"), "status": "ok"}
            else:
                reply = {"op": "done", "id": msg.get("id"), "status": "error", "error": "protocol"}
            _flush()
            _send(self.ctl, reply)

    def scoped_cell(
        self, cell_id: int, code: str, name: str | None, cwd: str | None
    ) -> dict[str, Any]:
        """A cell in scope ``name`` (None: the kernel's own namespace and directory)."""
        if name is None:
            return self.cell(cell_id, code, self.ns)
        scope = self.scopes.get(name)
        if scope is None:
            scope = self.scopes[name] = _Scope(cwd)
        try:
            home: str | None = os.getcwd()
        except OSError:  # the kernel's directory was removed: nothing to go back to
            home = None
        try:
            if scope.cwd is not None:
                os.chdir(scope.cwd)
        except OSError as exc:
            # As a cell that failed on its first line: the scope keeps its directory.
            _print_exception(exc, "")
            return {"op": "done", "id": cell_id, "status": "error", "error": type(exc).__name__}
        try:
            return self.cell(cell_id, code, scope.ns)
        finally:
            try:  # noqa: SIM105 - the cell may have removed its directory
                scope.cwd = os.getcwd()
            except OSError:
                pass
            if home is not None:
                try:  # noqa: SIM105 - or the kernel's
                    os.chdir(home)
                except OSError:
                    pass

    def cell(self, cell_id: int, code: str, ns: dict[str, Any]) -> dict[str, Any]:
        filename = f"<cell {cell_id}>"
        # Tracebacks show the cell's lines, as in a notebook.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        out_dir: str | None = None
        if self.run_cell is not None:
            _remove_tree(self.outputs_root)
            out_dir = f"{self.outputs_root}/{cell_id}"
            os.makedirs(out_dir, mode=0o700)
        reply: dict[str, Any] = {"op": "done", "id": cell_id, "out_dir": out_dir}
        try:
            _State.in_cell = True
            # From here a SIGINT interrupts this cell: the host sends the one it owes the cell
            # only once it has read this (cell_interrupt.py).
            _send(self.ctl, {"op": "started", "id": cell_id})
            if self.run_cell is not None and out_dir is not None:
                self.seq = self.run_cell(code, ns, out_dir, filename=filename, seq_start=self.seq)
            else:
                exec(compile(code, filename, "exec", dont_inherit=True), ns)  # noqa: S102
            _State.in_cell = False
            reply["status"] = "ok"
        except KeyboardInterrupt as exc:
            _State.in_cell = False
            reply["status"] = "interrupted"
            _print_exception(exc, filename)
        except SystemExit as exc:
            _State.in_cell = False
            code_value = exc.code
            if code_value is None or isinstance(code_value, int):
                reply["exit_code"] = code_value or 0
            else:
                # sys.exit("message") prints the message and means status 1, as in a script.
                sys.stderr.write(f"{code_value}\n")
                reply["exit_code"] = 1
            reply["status"] = "exit"
        except BaseException as exc:
            _State.in_cell = False
            reply["status"] = "error"
            reply["error"] = type(exc).__name__
            _print_exception(exc, filename)
        return reply


def _main(argv: list[str]) -> None:
    paths: list[str] = []
    display: str | None = None
    outputs_root = _OUTPUTS_ROOT
    args = iter(argv[1:])
    for arg in args:
        if arg == "--path":
            paths.append(next(args))
        elif arg == "--display":
            display = next(args)
        elif arg == "--outputs":
            outputs_root = next(args)
        else:
            os.write(2, f"sandcell-kernel: unknown argument {arg!r}\n".encode())
            os._exit(125)
    # Packages from the wheel cache: after the runtime's own, as in one-shot runs.
    sys.path.extend(paths)
    ctl = os.dup(0)  # non-inheritable: a process a cell starts does not get the channel
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, _on_sigint)
    _unbuffered_stdio()
    try:
        module = _load_display(display) if display else None
    except Exception as exc:
        os.write(2, f"sandcell-kernel: display module not loaded: {exc}\n".encode())
        module = None
    Kernel(ctl, module, outputs_root).serve()
    _flush()
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv)
