"""sandcell zygote: the template of warm starts, and the isolation of every run forked from it.

Usage (inside the template's bubblewrap sandbox, started by ``template.py``, never by hand)::

    python -I /sandcell/zygote.pyc CONTROL_FD PRELOAD

The template process (T) imports the modules named in PRELOAD (comma-separated), checks that it is
single-threaded, says ``R`` on the control socket (with its pid, which the kernel translates for
the host through SCM_CREDENTIALS) and then only ever waits for one of two requests:

* ``F`` + a socket descriptor: fork a child for one run; the socket goes to the child and T
  closes its copy. T never sees the request: code, environment and inputs go straight from the
  host to the child, so T never touches an untrusted byte;
* ``S``: answer with its state (thread count, sys.modules digest) so the host can check it is
  unchanged.

End of file on the control socket (the host closed it or died) ends T, and with it the whole pid
namespace of the template, every run included: T is its pid 1 (bwrap's ``--as-pid-1``), so the
kernel kills every process in it and in the pid namespaces nested in it.

A child isolates itself as if it were a fresh sandbox before it reads a byte of the request:

1. C (the forked child) sends its own credentials, closes everything but its socket, and
   unshares user, mount, pid, network, IPC, UTS and cgroup namespaces; its uid 1000 maps to the
   template's. C then forks G and exits: G is reparented to T, which reaps it, and a waiting
   sandbox keeps two processes (G and P), not three copies of the template's image.
2. G is pid 1 of the new pid namespace: it makes every mount private, mounts its own ``/proc``
   (sys, sysrq-trigger, irq and bus read-only, no nested user namespaces), fresh tmpfs at
   ``/tmp``, ``/sandbox``, ``/dev/shm``, ``/inputs`` and ``/sandcell``, brings up loopback, and
   says ``R`` with its credentials: the host learns G's pid and moves G into the run's cgroup.
   A pooled sandbox is then *armed* (``{"arm": ...}``, before any request exists): G forks P
   at once, P applies every restriction of step 5 that does not depend on the request (caps,
   no_new_privs, Landlock with ``/inputs`` always readable, the full seccomp filter) and waits;
   G says ``P`` to the host and waits too.
3. The request arrives: limits (tmpfs sizes are remounted), environment, the program and its
   descriptors (stdin, stdout, stderr, status), input trees cloned by the host (``open_tree``)
   and moved in read-only under ``/inputs``, and for a run that reaches outside its socket
   directory, moved in read-only at ``/sandcell/run/sandcell`` (the template's ``/run`` is a
   symlink to ``/sandcell/run``). With egress, G then starts the bridge: a child of its own
   with the run's rlimits, no capabilities, the full seccomp filter, not dumpable, that listens
   on 127.0.0.1:3128 before the program starts.
4. G forks P (an armed G has forked it already: it sets P's rlimits with ``prlimit``, drops its
   own capabilities and installs the full filter on itself, and only then hands P the
   environment and stdio) and supervises it like the boot's parent does (trusted, idle,
   reports the raw wait status); at the end it kills everything else in its pid namespace,
   reports status and CPU time, and holds the mount namespace until the host has read the
   exports.
5. P replaces the environment, sets the run's rlimits, drops every capability (bounding set
   included), sets no_new_privs, applies Landlock and the cold path's full seccomp filter, closes
   every descriptor but 0-2, reseeds the random generators, says "started" and runs the program
   in this interpreter as ``__main__`` (the boot's ``_run_python``, as a notebook cell of the
   display module when the run captures rich outputs): the preloaded modules are already in
   ``sys.modules``.
6. The end. Where the host can freeze the run's cgroup (the request says ``quiesce``), P, after
   the program and its epilogue (threads joined, atexit handlers, globals released, stdio
   flushed), writes its exit code into a page it shares with G (mapped before P was forked) and
   stops itself (SIGSTOP: a signal to itself, which Landlock's signal scope allows and which
   needs no descriptor the program could see). G sees the stop (``WUNTRACED``) and writes
   ``D<code>`` on the status pipe; the host freezes the cgroup, reads output, status and
   exports from a sandbox where nothing runs, returns the result, and kills and thaws the group
   in its background teardown, so the exit of the program's copy of the template image (several
   milliseconds of page-table teardown) is no longer on the result path. The code is what
   ``os._exit`` would have said, which the program could have said itself; a death by signal, a
   bare ``os._exit`` or KeyboardInterrupt are never reported early (pid 1 reports them as
   before). Without a freezer (``rlimits`` mode, a v1 host without the controller) P exits.

Standalone on purpose (stdlib only): it is copied into the template's sandbox, in four parts
along the processes above, each compiled by the host and placed in ``/sandcell``: this file
(the entry and T, the template loop), ``_zygote_base.py`` (what every process uses: constants,
libc, messages, descriptor hygiene, the capability drop and the seccomp install, pid 1's
reports), ``_zygote_program.py`` (P) and ``_zygote_init.py`` (C and G). This file executes the
other three into its own namespace before it starts, so in the template they are one module,
as they were one file; on the host (tests, type checks) they import each other. Failures of a
child exit 125 with a ``sandcell-zygote:`` line on the run's stderr.

Security limitations: every run of a template shares the template's memory image as it was
before the fork (copy-on-write): module state, the hash secret of ``str`` (``PYTHONHASHSEED``)
and the address-space layout (ASLR is per exec, not per fork). Nothing of another run is in it,
but a run can learn the layout a sibling run has. The template's own sandbox allows what the
setup needs (unshare, mount); the program never runs under that filter alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

_PARTS = ("base", "program", "init")
# In the template the parts run in one namespace (``_zygote.py`` executes them into its own, in
# the order base, program, init); imported as modules (tests, type checks) they import each other.
if __name__ != "__main__":
    from sandcell.backends.namespaces._zygote_base import (
        _FAILED,
        _fail,
        _prepare_calls,
        _recv,
        _send,
    )
    from sandcell.backends.namespaces._zygote_init import _child
    from sandcell.backends.namespaces._zygote_program import _run_program, _settle_env


def _load_parts() -> None:
    """The other parts' code (compiled by the host next to this file) into this namespace."""
    import marshal

    for part in _PARTS:
        with open(f"/sandcell/zygote_{part}.pyc", "rb") as f:
            code = marshal.loads(f.read()[16:])  # noqa: S302 - the host compiled it for us
        exec(code, globals())  # noqa: S102 - sandcell's own zygote


# -- the template ----------------------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _state() -> dict[str, Any]:
    import hashlib

    names = "\n".join(sorted(sys.modules)).encode()
    return {
        "pid": os.getpid(),
        "threads": _threads(),
        "modules": len(sys.modules),
        "modules_sha256": hashlib.sha256(names).hexdigest(),
    }


def _template(control_fd: int, preload: list[str]) -> tuple[socket.socket, bytes, dict[str, Any]]:
    """Run the template loop; returns only in a forked child: its socket, the run's seccomp
    program and the boot's functions (with the display module as ``_display``)."""
    control = socket.socket(fileno=control_fd)
    with open("/sandcell/seccomp.bpf", "rb") as f:
        seccomp_program = f.read()
    _prepare_calls(seccomp_program)
    boot = _load_boot("/sandcell/boot.pyc")
    # Every run forked from here starts with the signals the caller's environment ignored
    # (nohup's SIGHUP...) back at their defaults, as a cold run's boot does.
    boot["_default_signals"]()
    # Loaded once here (trusted code): a run that displays finds it in its copy of the image.
    boot["_display"] = boot["_load_display"]("/sandcell/display.pyc")
    # The boot's C calls (Landlock, compiling the program) built once here, not in every run.
    boot["_ffi"]()
    for name in preload:
        __import__(name)
    _settle_env()
    # Frozen: the template's objects stay out of every child's garbage collections, whose
    # reference-count writes would otherwise copy their pages into each run.
    import gc

    gc.collect()
    gc.freeze()
    # Children that exit are reaped by the kernel: the template waits for nothing.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    threads = _threads()
    if threads != 1:
        _send(control, json.dumps({"error": f"{threads} threads after the preload"}).encode())
        os._exit(_FAILED)
    _send(control, json.dumps({"ready": _state(), "preloaded": preload}).encode(), creds=True)
    while True:
        try:
            msg, fds = _recv(control, 1)
        except (OSError, EOFError):
            os._exit(0)
        if not msg:
            os._exit(0)  # the host is gone
        if msg == b"S":
            _send(control, json.dumps(_state()).encode())
            continue
        if msg != b"F" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        # A fork with a second thread alive would copy a lock some thread holds: refuse.
        if _threads() != 1:
            os.close(fds[0])
            os._exit(_FAILED)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            control.close()
            return socket.socket(fileno=fds[0]), seccomp_program, boot
        os.close(fds[0])


def _load_boot(path: str) -> dict[str, Any]:
    """The boot's functions, from its compiled file, without putting it on sys.path."""
    import marshal

    with open(path, "rb") as f:
        code = marshal.loads(f.read()[16:])  # noqa: S302 - the host compiled it for us
    ns: dict[str, Any] = {"__name__": "_sandcell_boot", "__builtins__": __builtins__}
    exec(code, ns)  # noqa: S102 - sandcell's own boot, compiled by the host
    return ns


def _main() -> NoReturn:
    if len(sys.argv) != 3:
        _fail("usage: zygote.pyc CONTROL_FD PRELOAD")
    preload = [m for m in sys.argv[2].split(",") if m]
    sock, seccomp_program, boot = _template(int(sys.argv[1]), preload)
    _run_program(_child(sock, seccomp_program, boot), boot)


if __name__ == "__main__":
    _load_parts()
    _main()
