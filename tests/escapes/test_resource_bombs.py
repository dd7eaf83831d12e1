"""Resource bombs: processes, memory, disk, inodes, output and time are capped by the kernel, the
run ends with the right outcome, and nothing of it outlives the run on the host.

Processes started by an attack carry a unique marker in their command line (``argv[0]``), so the
host can look for survivors after the run. A check that nothing survived means something only once
the processes were seen to exist: the program counts them in its own ``/proc``, and on the
namespaces backend, where they are host processes, the host watches for them while the run is on
(:func:`_run_watched`). On the other rungs they live in gVisor's kernel or a VM, out of the host's
sight: there the inner count is the proof they existed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.conftest import wasm_cannot

from .conftest import processes_with

if TYPE_CHECKING:
    from .conftest import Attack

MiB = 1024 * 1024


def _survivors(token: str, grace_s: float = 5.0) -> list[str]:
    """Host processes still carrying the marker once the run is over (after a short grace for the
    kernel to finish tearing down the namespace)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = processes_with(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _marked(token: str, prefix: str) -> list[str]:
    """Host processes with ``token`` whose command line (arguments joined by spaces) starts with
    ``prefix``: the CLI running an attack as the ordinary user has the token further on."""
    return [p for p in processes_with(token) if p.split(": ", 1)[1].startswith(prefix)]


def _run_watched(
    attack: Attack,
    body: str,
    token: str,
    prefix: str,
    *,
    on_seen: Callable[[], None] | None = None,
    **kw: Any,
) -> tuple[dict[str, object], int]:
    """Run the attack on a thread while the host looks for its processes (command lines starting
    with ``prefix``); ``on_seen`` is called once they were seen. Returns the result and the most
    such processes seen at once."""
    box: dict[str, Any] = {}
    if attack.sandbox.backend != "namespaces":
        return attack.run(body, **kw), 0  # out of the host's sight (see the module)

    def run() -> None:
        try:
            box["res"] = attack.run(body, **kw)
        except BaseException as exc:  # re-raised below, in the test's thread
            box["exc"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    seen = 0
    while thread.is_alive():
        now = len(_marked(token, prefix))
        if now and not seen and on_seen is not None:
            on_seen()
        seen = max(seen, now)
        thread.join(0.02)
    if "exc" in box:
        raise box["exc"]
    return box["res"], seen


def test_blocks_fork_bomb(attack: Attack, token: str, tmp_path: Path) -> None:
    """Fork until the kernel refuses; the children (sleepers) die with the run. The program waits
    (on a gate file the host opens) until the host has seen the sleepers."""
    wasm_cannot(attack.sandbox, "processes")
    gate = tmp_path / "gate"
    gate.mkdir(mode=0o755)
    # A file's content, not a name created later: an input directory shows the names it had when
    # the run first looked them up (neutral_sources.py).
    (gate / "seen").write_text("")
    (gate / "seen").chmod(0o644)
    watched = attack.sandbox.backend == "namespaces"
    body = f"""
    import time
    n = 0
    for n in range(1, 1001):
        try:
            pid = os.fork()
        except OSError as exc:
            blocked(f"fork number {{n}}", errname(exc))
            break
        if pid == 0:
            try:
                os.execv("/bin/sleep", ["sleep-{token}", "30"])
            finally:
                os._exit(1)
    else:
        breach("1000 processes forked without a refusal")
    inside = 0
    for p in os.listdir("/proc"):
        try:
            inside += open(f"/proc/{{p}}/cmdline", "rb").read().startswith(b"sleep-{token}")
        except OSError:
            pass
    print("sleepers inside:", inside)
    for _ in range(1500 if {watched!r} else 0):
        if open("/inputs/gate/seen").read():
            print("gate: the host saw the sleepers")
            break
        time.sleep(0.02)
    """
    res, seen = _run_watched(
        attack,
        body,
        token,
        f"sleep-{token}",
        on_seen=lambda: (gate / "seen").write_text("seen"),
        max_pids=16,
        inputs=[gate],
        wall_time_s=60,
    )
    out = attack.expect_blocked(res, attempts=1)
    assert "EAGAIN" in out, out
    assert "sleepers inside: 0" not in out and "sleepers inside:" in out, out
    if watched:
        assert seen > 0 and "gate: the host saw the sleepers" in out, (seen, out)
    assert not _survivors(token), f"[{attack.identity}] processes outlived the run"


@pytest.mark.slow
def test_blocks_shell_fork_bomb(attack: Attack, token: str) -> None:
    """The classic ``f(){ f|f & }; f``: the process count stays at the cap; the host is fine."""
    wasm_cannot(attack.sandbox, "processes")
    body = f"""
    import subprocess, time
    subprocess.Popen(["/bin/bash", "-c", ": {token}; f(){{ f | f & }}; f"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) > 40:
        breach(f"{{len(pids)}} processes alive in the sandbox")
    else:
        blocked("grow past the process cap", f"{{len(pids)}} processes alive")
    sys.stdout.flush()
    os._exit(0)
    """
    res, seen = _run_watched(
        attack, body, token, f"/bin/bash -c : {token};", max_pids=24, wall_time_s=20
    )
    out = str(res["stdout"])
    assert "BREACH" not in out, res
    assert "blocked: grow past the process cap" in out, res
    assert res["outcome"] in ("ok", "timeout"), res
    if attack.sandbox.backend == "namespaces":
        assert seen > 0, f"[{attack.identity}] the host never saw the fork bomb's shells"
    assert not _survivors(token), f"[{attack.identity}] fork bomb processes outlived the run"


def test_blocks_memory_bomb(attack: Attack) -> None:
    # The wasm rung's smallest memory limit is 256 MiB (Node.js and Pyodide take ~160 MiB).
    limit = 256 if attack.sandbox.backend == "wasm" else 64
    body = f"""
    print("bomb: allocating", flush=True)
    hoard = []
    for i in range({limit}):
        hoard.append(b"\\x01" * (16 << 20))  # touched pages, not a lazy calloc
    breach(f"allocated {{len(hoard) * 16}} MiB under a {limit} MiB limit")
    """
    res = attack.run(body, memory_mb=limit)
    out = str(res["stdout"])
    assert "bomb: allocating" in out, res
    assert "BREACH" not in out, f"[{attack.identity}] ESCAPE: {res}"
    assert res["outcome"] == "memory_limit", res


def test_blocks_workspace_disk_fill(attack: Attack) -> None:
    body = """
    written = 0
    chunk = b"\\x01" * (1 << 20)
    try:
        for i in range(256):
            with open(f"fill-{i}.bin", "wb") as f:
                for _ in range(4):
                    f.write(chunk)
                    f.flush()
                    written += 1
    except OSError as exc:
        blocked(f"fill the workspace (after {written} MiB)", errname(exc))
    if written > 24:
        breach(f"{written} MiB written into a 16 MiB workspace")
    """
    res = attack.run(body, workspace_mb=16)
    out = attack.expect_blocked(res, attempts=1)
    assert "ENOSPC" in out, out


def test_blocks_workspace_inode_fill(attack: Attack) -> None:
    body = """
    made = 0
    try:
        for made in range(100_000):
            os.close(os.open(f"i{made}", os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError as exc:
        blocked(f"create files (after {made})", errname(exc))
    if made > 20_000:
        breach(f"{made} files created in a workspace capped at 16384 inodes")
    """
    res = attack.run(body)
    out = attack.expect_blocked(res, attempts=1)
    assert "ENOSPC" in out, out


# /dev/shm is a tmpfs of its own, sized like /tmp: left at the kernel default it would take half
# the host's memory, which in the rlimits mode (no memory cgroup) nothing else bounds.
@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_blocks_tmp_disk_fill(attack: Attack, where: str) -> None:
    body = f"""
    written = 0
    chunk = b"\\x01" * (1 << 20)
    try:
        for i in range(512):
            with open(f"{where}/fill-{{i}}.bin", "wb") as f:
                for _ in range(4):
                    f.write(chunk)
                    f.flush()
                    written += 1
    except OSError as exc:
        blocked(f"fill {where} (after {{written}} MiB)", errname(exc))
    if written > 96:
        breach(f"{{written}} MiB written into {where}, a 64 MiB tmpfs")
    """
    res = attack.run(body)
    if (
        attack.sandbox.backend == "wasm"
        and where == "/dev/shm"
        and res["outcome"] == "memory_limit"
    ):
        # Pyodide's /dev/shm is its in-memory filesystem, no tmpfs: what bounds it is the run's
        # memory limit, which must end the run before the breach line.
        assert "BREACH" not in str(res["stdout"]), res
        return
    out = attack.expect_blocked(res, attempts=1)
    assert "ENOSPC" in out, out


def test_blocks_stdout_flood(attack: Attack) -> None:
    body = """
    print("flood: start", flush=True)
    block = "A" * 65536
    for _ in range(10_000):
        sys.stdout.write(block)
    breach("640 MiB of output went through")
    """
    res = attack.run(body, stdout_bytes=65536)
    out = str(res["stdout"])
    assert out.startswith("flood: start"), res["reason"]
    assert "BREACH" not in out
    assert res["outcome"] == "output_limit", res["reason"]
    assert res["stdout_truncated"] is True
    assert len(out.encode()) <= 65536


def test_blocks_stderr_flood(attack: Attack) -> None:
    body = """
    block = "E" * 65536
    for _ in range(10_000):
        sys.stderr.write(block)
    breach("640 MiB of error output went through")
    """
    res = attack.run(body, stderr_bytes=65536)
    assert "BREACH" not in str(res["stdout"])
    assert res["outcome"] == "output_limit", res["reason"]
    assert res["stderr_truncated"] is True
    assert len(str(res["stderr"]).encode()) <= 65536


@pytest.mark.slow
def test_blocks_infinite_loop(attack: Attack, token: str) -> None:
    """A busy loop with a long sleeper child: the run ends at the wall limit and the whole process
    tree is gone. (The wasm rung's wall limit: tests/contract/test_wasm.py.)"""
    wasm_cannot(attack.sandbox, "processes")
    body = f"""
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep-{token}", "1000"])
        finally:
            os._exit(1)
    print("loop: start, sleeper", os.path.exists(f"/proc/{{pid}}"), flush=True)
    while True:
        pass
    """
    res, seen = _run_watched(attack, body, token, f"sleep-{token}", wall_time_s=2)
    assert "loop: start, sleeper True" in str(res["stdout"]), res
    assert res["outcome"] == "timeout", res["reason"]
    if attack.sandbox.backend == "namespaces":
        assert seen == 1, f"[{attack.identity}] the host never saw the sleeper ({seen})"
    assert not _survivors(token), f"[{attack.identity}] the sleeper outlived the run"
