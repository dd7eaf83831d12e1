"""sandcell zygote, part 2 of 4: P, the program's process (its restrictions, the request's
environment, the run of the program as ``__main__`` and its exit). See ``_zygote.py``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

# In the template the parts run in one namespace (``_zygote.py`` executes them into its own, in
# the order base, program, init); imported as modules (tests, type checks) they import each other.
if __name__ != "__main__":
    from sandcell.backends.namespaces._zygote_base import (
        _FAILED,
        DONE_PAGE,
        DONE_TAG,
        _close_all_but,
        _drop_capabilities,
        _fail,
        _install_seccomp,
        _recv,
        _write,
    )


# The template's environment once its preload ran (``_settle_env``): what every process forked
# from it holds until its request says otherwise.
_TEMPLATE_ENV: dict[str, str] = {}


def _settle_env() -> None:
    """In the template, after its preload: drop the variables that were for the preload only
    (the host names them in ``SANDCELL_PRELOAD_ONLY``), so that the environment left is the runs'
    usual one, and remember it."""
    for name in os.environ.pop("SANDCELL_PRELOAD_ONLY", "").split(","):
        os.environ.pop(name, None)
    _TEMPLATE_ENV.clear()
    _TEMPLATE_ENV.update(os.environ)


def _set_env(env: dict[str, str]) -> None:
    """The program's environment. Where it is the template's (the usual run's), nothing is
    changed: replacing it would run the environment mapping's Python code, whose first calls in
    this process copy pages of the template's image on the request's path."""
    if env == _TEMPLATE_ENV:
        return
    os.environ.clear()
    os.environ.update(env)


def _prepared_program(
    sock: socket.socket,
    arm: dict[str, Any],
    seccomp_program: bytes,
    boot: dict[str, Any],
    page: Any,
) -> dict[str, Any]:
    """P of a pooled sandbox: every restriction that does not depend on the request (all of
    them but the environment and the rlimits, which pid 1 sets), then the request."""
    try:
        _close_all_but({sock.fileno()})
        os.chdir("/sandbox")
        os.umask(0o022)
        _write("/proc/self/oom_score_adj", "1000")
        _drop_capabilities()
    except Exception as exc:
        _fail(f"restrict: {exc}")
    _lock_down(arm.get("landlock"), seccomp_program, boot)
    _reseed()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sock.sendall(b"K")
        body, fds = _recv(sock, 4)
    except Exception:
        os._exit(_FAILED)
    if not body or len(fds) != 4:
        os._exit(0)  # pid 1 let it go
    stdin, stdout, stderr, status = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sock.close()
    req: dict[str, Any] = json.loads(body)
    if req.get("quiesce"):
        req["_quiesce"] = (os.getpid(), page)
    _set_env(req["env"])
    try:
        os.write(status, b"1")
        os.close(status)
    except OSError as exc:
        _fail(f"status descriptor: {exc}")
    return req


def _lock_down(landlock: Any, seccomp_program: bytes, boot: dict[str, Any]) -> None:
    """The program process's last two walls, in this order on every path: Landlock (needs the
    syscalls seccomp would refuse), then the cold path's full seccomp filter."""
    if landlock is not None:
        boot["_restrict"](landlock)
    try:
        _install_seccomp(seccomp_program)
    except Exception as exc:
        _fail(f"seccomp: {exc}")


def _reseed() -> None:
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _restrict(
    req: dict[str, Any], status_fd: int, seccomp_program: bytes, boot: dict[str, Any]
) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        os.chdir("/sandbox")
        os.umask(0o022)
        _set_env(req["env"])
        _write("/proc/self/oom_score_adj", "1000")
        for name, soft, hard, relative in req["rlimits"]:
            # The address space the template already maps is not the program's to count.
            base = _address_space() if relative else 0
            resource.setrlimit(getattr(resource, name), (soft + base, hard + base))
        _drop_capabilities()
    except Exception as exc:
        _fail(f"restrict: {exc}")
    _lock_down(req.get("landlock"), seccomp_program, boot)
    boot["_close_inherited"](status_fd)
    _reseed()
    try:
        os.write(status_fd, b"1")
        os.close(status_fd)
    except OSError as exc:
        _fail(f"status descriptor: {exc}")


def _exit_status(code: object) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:  # noqa: SIM105 - contextlib is not worth importing in every run
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: S110 - a broken stderr: the status still says it
        pass
    return 1


def _run_program(req: dict[str, Any], boot: dict[str, Any]) -> NoReturn:
    """Run the program as ``__main__``, then exit as the interpreter would, minus its teardown.

    A full interpreter shutdown would also tear down every preloaded module, touching (and so
    copying) the whole template image for nothing: after the program, non-daemon threads are
    joined, atexit handlers run, the program's own globals are released and its garbage
    collected (so open files are flushed and closed), stdio is flushed, and the process exits.
    """
    script = f"/sandcell/{req['script']}"
    sys.argv = [script]
    # The run's socket library (sandcell_tools), after the runtime's own paths, as cold.
    sys.path.extend(req.get("python_paths") or ())
    status = 0
    interrupted = False
    display = req.get("display")
    try:
        boot["_run_python"](script, [], (boot["_display"], display) if display else None)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except KeyboardInterrupt as exc:
        boot["_report"](exc, exc.__traceback__)
        interrupted = True
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
        main = sys.modules.get("__main__")
        if main is not None:
            main.__dict__.clear()
        import gc

        gc.collect()
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # what the interpreter would print at exit
        boot["_report"](exc, exc.__traceback__)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120  # the interpreter's status when stdout cannot be flushed at exit
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    else:
        _end_quietly(req.get("_quiesce"), status)
    os._exit(status)


def _end_quietly(quiesce: Any, status: int) -> None:
    """Where the host freezes the run's cgroup: say the program ended (its exit code in the page
    shared with pid 1), then stop. pid 1 reports that at once, the host freezes the run, reads
    the result and the exports from a sandbox where nothing moves, and the exit itself (the
    kernel's teardown of this copy of the template's image, several milliseconds) happens in
    its background teardown. What is claimed here is what ``os._exit`` would have said: the
    program could have said it itself. Without a page (no freezer) the process just exits, and
    so does a process the program forked that ran on to the end of the program: only pid 1's
    own child may stop (a stopped grandchild would hang the program waiting for it)."""
    if quiesce is None:
        return
    pid, page = quiesce
    if os.getpid() != pid:
        return
    try:
        page[:DONE_PAGE] = struct.pack("=II", DONE_TAG, status & 0xFF)
        os.kill(os.getpid(), signal.SIGSTOP)
    except Exception:  # noqa: S110 - the program broke the page: pid 1 reports the exit instead
        pass
