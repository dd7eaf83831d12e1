"""sandcell's guest runner: becomes the program (standalone, runs in the guest, no sandcell).

Started by the agent at boot with the runtime's interpreter (``-I``), in the program's cgroup. It
imports the preload modules (``SANDCELL_PRELOAD``, comma-separated), says ``R`` on its socket
(descriptor given as argument) and waits. A VM restored from a snapshot resumes here, so the job
first reseeds what the preload may have seeded from the snapshot's kernel (``random``, numpy's
legacy generator), then: rlimits, uid/gid 1000 with no groups, the job's environment, stdio from
the three descriptors sent with the job, ``/sandbox`` as working directory, and the program: a
python program runs in this process as ``__main__`` (the preloaded modules already imported),
a bash or Node program replaces it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import json
import os
import resource
import socket
import sys
import traceback

# Not imported at run time: pid 1 of a guest starts faster without typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


UID = GID = 1000
# Loaded before the snapshot: a run does not pay for finding libc.
_prctl = ctypes.CDLL(None).prctl


def preload() -> None:
    names = [n for n in os.environ.get("SANDCELL_PRELOAD", "").split(",") if n]
    for name in names:
        before = set(sys.modules)
        try:
            __import__(name)
        except Exception as exc:
            # A half-done import leaves some of its modules behind (matplotlib's submodules
            # without matplotlib): the program's own import must start from nothing, not them.
            for added in set(sys.modules) - before:
                del sys.modules[added]
            os.write(2, f"sandcell-runner: preload {name}: {exc}\n".encode())


def reseed() -> None:
    rnd = sys.modules.get("random")
    if rnd is not None:
        rnd.seed()
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        nprandom.seed()


def limits(lim: dict[str, int]) -> None:
    # RLIMIT_CPU counts this process's whole life, and the preload already spent seconds of it
    # (more under TCG): the program's budget starts from what is spent, rounded up to a second.
    spent = resource.getrusage(resource.RUSAGE_SELF)
    used = spent.ru_utime + spent.ru_stime
    cpu = int(lim["cpu_time_s"]) + int(used) + (used > int(used))
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, (lim["max_file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2),
        (resource.RLIMIT_NPROC, (lim["max_pids"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def become(job: dict[str, Any], fds: list[int]) -> None:
    reseed()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir("/sandbox")
    os.setgroups([])
    os.setresgid(GID, GID, GID)
    os.setresuid(UID, UID, UID)
    # A credential change leaves the process non-dumpable, which hides it (and children that
    # have not exec'd yet) from its own /proc under hidepid; the program is its own, as on the
    # host. PR_SET_DUMPABLE = 4.
    _prctl(4, 1, 0, 0, 0)
    limits(job["limits"])
    os.environ.clear()
    os.environ.update(job["env"])
    unbuffered = bool(job["env"].get("PYTHONUNBUFFERED"))
    sys.stdout = _output(1, unbuffered=unbuffered)
    sys.stderr = _output(2, unbuffered=unbuffered)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115


def _output(fd: int, *, unbuffered: bool) -> io.TextIOWrapper:
    """The program's stdout or stderr as its interpreter would have opened them, had it been
    started with the job's environment: unbuffered under ``PYTHONUNBUFFERED`` (which every
    runtime sets, as on the other backends, so the host streams each write as it happens),
    else line-buffered."""
    if unbuffered:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(
            raw,
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
    return open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)


def run_python(job: dict[str, Any]) -> None:
    path = job["code_path"]
    sys.argv = [path]
    sys.path[0:0] = ["/sandbox"]
    # Packages from the wheel cache: after the runtime's own site-packages, as on the namespaces
    # backend, so they add modules but never shadow the runtime's (a session's kernel inherits).
    sys.path.extend(job.get("python_paths", []))
    main = type(sys)("__main__")
    ns = main.__dict__
    ns.update({"__file__": path, "__builtins__": sys.modules["builtins"], "__cached__": None})
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        source = f.read()
    if job["display"]:
        display = _load_display()
        try:
            display.run_cell(
                source.decode("utf-8-sig"), ns, "/sandbox/.sandcell-display", filename=path
            )
        except SystemExit:
            raise
        except BaseException as exc:
            tb = display.user_traceback(exc.__traceback__)
            traceback.print_exception(type(exc), exc, tb)
            raise SystemExit(1) from None
        return
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        traceback.print_exception(type(exc), exc, None)
        raise SystemExit(1) from None
    try:
        exec(code, ns)  # noqa: S102 - running the program is the point
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else None)
        raise SystemExit(1) from None


def _load_display() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_sandcell_display", "/opt/sandcell/display.py")
    if spec is None or spec.loader is None:
        raise ImportError("the display module is missing from the guest image")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WARM_CODE = (
    "import os, random\nx = [random.random() for _ in range(100)]\nprint(len(x), os.getpid())\n"
)


WARM_LIMITS = {"cpu_time_s": 60, "max_file_bytes": 1 << 20, "max_open_files": 64, "max_pids": 64}


def warm() -> None:
    """Run the paths a program takes once, in a forked child, the whole way from the job to the
    program's exit (credentials, limits, stdio on a pipe, compile, exec, print, exit), output
    discarded. In a VM restored from a snapshot, QEMU translates the guest's code anew: doing it
    here, before the VM waits in the pool, takes that cost off the run."""
    json.loads(json.dumps({"env": dict(os.environ), "limits": {"a": 1}}))
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # The program read from a file and run as ``__main__``, as a run's is: measured
            # with QEMU's ``info jit``, a pooled print(1) translated about 1,200 blocks of the
            # interpreter that a program compiled from a string never took.
            code = os.memfd_create("warm")
            os.write(code, WARM_CODE.encode())
            fds = [os.open(os.devnull, os.O_RDONLY), out_w, os.dup(out_w)]
            become({"limits": WARM_LIMITS, "env": dict(os.environ)}, fds)
            run_python({"code_path": f"/proc/self/fd/{code}", "display": False})
            # Not the exit handlers: they belong to the waiting runner, not to this child.
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(out_w)
    while os.read(out_r, 1 << 16):
        pass
    os.close(out_r)
    os.waitpid(pid, 0)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    preload()
    sock.sendall(b"R")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
        job = json.loads(msg)
        if not job.get("warm"):
            break
        # The warm-up's descriptors only took the path a job's take.
        for fd in fds:
            os.close(fd)
        warm()
        sock.sendall(b"w")
    # The program gets no descriptor of sandcell's: only its stdin, stdout and stderr.
    sock.close()
    become(job, fds)
    if job["language"] != "python":
        # Bash, or Node (JavaScript, TypeScript) with its permission flags before the path.
        interpreter = job["interpreter"]
        # ``args``: a session's Node kernel's own arguments (``guest/session.py``).
        argv = [
            interpreter,
            *job.get("interpreter_args", ()),
            job["code_path"],
            *job.get("args", ()),
        ]
        os.execve(interpreter, argv, job["env"])
    code = 0
    try:
        run_python(job)
    except SystemExit as exc:
        code = _status(exc.code)
    # The program's exit handlers run and its output is flushed, as at a normal exit; the
    # interpreter's teardown of every module (pandas's included) is skipped: the VM is
    # destroyed next, and tearing down costs seconds of translated code under TCG.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{code}\n")
    return 1


if __name__ == "__main__":
    main()
