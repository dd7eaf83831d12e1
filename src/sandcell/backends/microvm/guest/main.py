"""The agent's life: boot, the host's handshake, then exactly one job (a run or a session).

:func:`run` is what the entry script (``/opt/sandcell/agent.py``) calls: any failure is logged on
the console and powers the guest off, so that the host sees QEMU exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from .boot import boot
from .cgroup import cgroup_stats, cpu_usage_ms, prepare_cgroup
from .files import send_exports
from .forward import Forwarder
from .job import receive_inputs, reseed, set_identity
from .port import Port, find_port
from .run import run_program
from .session import session_main
from .system import RB_POWER_OFF, libc, log
from .warm import warm_kernel_paths


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = Port(find_port())
    try:
        runner_pid, runner_sock = boot()
    except Exception as exc:
        port.handshake()
        port.send(b"W", json.dumps({"message": f"guest boot failed: {exc}"}).encode())
        raise
    port.handshake()
    job = None
    while job is None:
        frames = port.frames(1.0)
        while frames:
            kind, payload = frames.pop(0)
            if kind == b"P":
                # Warm the translated code before the VM waits in the pool (see runner.warm).
                # With descriptors, as a job comes: their passing is warmed too.
                stand_ins = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
                socket.send_fds(runner_sock, [b'{"warm": true}'], stand_ins)
                for fd in stand_ins:
                    os.close(fd)
                runner_sock.recv(1)
                warm_kernel_paths(runner_pid)
                port.send(b"p")
            elif kind == b"J":
                job = json.loads(payload)
                break
            elif kind == b"Q":
                session_main(port, runner_pid, runner_sock, json.loads(payload), frames)
    # Frames that came with the job (inputs, stdin, go) are handled next, in order.
    port.early = frames
    fwd = None
    try:
        reseed(bytes.fromhex(job["entropy"]))
        set_identity(job)
        prepare_cgroup(job["limits"])
        if job.get("sockets"):
            fwd = Forwarder(port)
            fwd.setup(job["sockets"], job["limits"])
        stdin = receive_inputs(port, job)
    except Exception as exc:
        port.send(b"W", json.dumps({"message": f"guest setup failed: {exc}"}).encode())
        raise
    cpu_before = cpu_usage_ms()
    status = run_program(port, runner_pid, runner_sock, job, stdin, fwd)
    report = cgroup_stats(cpu_before)
    report["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    report["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    port.send(b"X", json.dumps(report).encode())
    send_exports(port, job["exports"], job["display"], job["export_budget"])
    port.send(b"Z")
    # The host destroys the VM; until then, nothing more happens here.
    while True:
        time.sleep(3600)


def run() -> None:
    """:func:`main`, as pid 1: whatever ends it is logged, then the guest powers off."""
    try:
        main()
    except BaseException as exc:
        log(f"failed: {type(exc).__name__}: {exc}")
        libc.reboot(RB_POWER_OFF)
