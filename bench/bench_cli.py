"""The command line's own start: ``sandcell run -c pass`` with and without a service, against
``python3 -c pass``, all measured in this run.

    .venv/bin/python bench/bench_cli.py [--rounds N] [--importtime] [--against TREE] [--kept N]

Runs as root (the namespaces backend as root). Starts ``sandcell serve --start pool`` over a
fresh home (its local socket in the home) with a tenant whose key the CLI gets in
``SANDCELL_API_KEY``, then, in interleaved rounds:

* ``python3 -c pass`` (this interpreter): the baseline;
* ``sandcell run -c pass`` with the service up: the CLI sends the run over the socket
  (target: at most 2x the baseline);
* ``sandcell run -c pass --no-service``: the run in this process, a cold sandbox (target: at
  most 150 ms);
* the same ``POST /v1/runs`` the CLI sends, from this process over the same socket: the
  service's share of the CLI's time (what is left is the CLI's own start).

With ``--against TREE`` (another checkout, e.g. ``git worktree add /tmp/base COMMIT``), the
same ``sandcell run -c pass`` through that tree's ``bin/sandcell`` (its ``src`` first on
``PYTHONPATH``, the flags on its ``#!`` line kept) joins the rounds against the same service:
before and after a change to the command's start, measured alternately.

With ``--kept N``, the service is first sent N runs that its profile denies (no sandbox, a
few ms each), so that it holds N finished runs, as a service does once it has run that many
(it keeps up to 1,000). Before and after a change to the service, run the bench alternately
with ``PYTHONPATH=TREE/src`` (the service and the command from TREE) and without.

Each call to the service comes 0.3 s after the one before, as a person's commands do: the warm
pool has refilled by then, instead of the call sharing the two CPUs with the refill.

Every call must print nothing and exit 0, and the service must have the runs it was sent. With
``--importtime`` it also prints the slowest imports of each CLI path (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SANDCELL = [sys.executable, "-m", "sandcell"]
_SCRIPT = Path(sys.executable).parent / "sandcell"
# What a person types: the installed console script (no runpy), where there is one.
COMMAND = [str(_SCRIPT)] if _SCRIPT.is_file() else SANDCELL


# Before each call to the service: the pool has refilled after the previous run (a person's
# commands are seconds apart; back to back, a call would share the CPUs with that refill).
_SETTLE_S = 0.3


def _start(home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SANDCELL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    log = (home / "serve.log").open("a")
    proc = subprocess.Popen(
        [*SANDCELL, "serve", "--port", "0", "--start", "pool", "--pool-size", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    log.close()
    assert proc.stdout is not None
    found = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
    if found is None:
        proc.kill()
        raise SystemExit(f"the service did not start; see {home / 'serve.log'}")
    url = f"http://127.0.0.1:{found.group(1)}/healthz"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url, timeout=5):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service never answered")


def _tree_command(tree: Path) -> list[str]:
    """``tree``'s bin/sandcell run by this interpreter as its ``#!python`` line would."""
    script = tree / "bin" / "sandcell"
    first = script.read_text(encoding="utf-8").splitlines()[0]
    if not first.startswith("#!python"):
        raise SystemExit(f"{script} does not start with #!python")
    return [sys.executable, *first.removeprefix("#!python").split(), str(script)]


def _timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """The call's wall time and its CPU time (user + system, its own and its children's), in
    ms. The CPU time is the steadier of the two on a host shared with other work."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = (time.perf_counter() - began) * 1000
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or done.stdout or done.stderr:
        raise SystemExit(f"{argv} failed ({done.returncode}): {done.stdout}{done.stderr}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return elapsed, cpu * 1000


def _slowest_imports(argv: Sequence[str], env: dict[str, str], n: int = 8) -> list[str]:
    # The command as it is run: the installed script, or `-m sandcell` without one.
    script = argv[1:] if argv[0] == sys.executable else argv
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *script],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    rows = []
    total = 0
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].strip()))
            if not parts[2].startswith("  "):  # a top-level import: nested ones are in it
                total += int(parts[1])
    top = [f"{us / 1000:7.1f} ms  {name}" for us, name in sorted(rows, reverse=True)[:n]]
    return [f"all imports {total / 1000:.1f} ms", *top]


def _request_ms(sock_path: Path, key: str) -> tuple[float, float]:
    """One ``POST /v1/runs`` of ``pass`` as the CLI sends it (a connection of its own): its
    time, and the sandbox's own wall time in it (the run's ``usage.wall_ms``)."""
    body = json.dumps({"code": "pass"}).encode()
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        f"Authorization: Bearer {key}\r\nAccept: application/json\r\n"
        f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n"
    )
    began = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(sock_path))
        sock.sendall(head.encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    elapsed = (time.perf_counter() - began) * 1000
    result = None
    if answer.startswith(b"HTTP/1.1 200 "):
        result = json.loads(answer.partition(b"\r\n\r\n")[2])["result"]
    if result is None or result["outcome"] != "ok":
        raise SystemExit(f"the request failed: {answer[:300]!r}")
    return elapsed, float(result["usage"]["wall_ms"])


def _keep_runs(sock_path: Path, key: str, n: int) -> None:
    """Leave ``n`` finished runs in the service: each denied by the profile (strict allows
    no ``ctypes``), so none starts a sandbox."""
    body = json.dumps({"code": "import ctypes"}).encode()
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: application/json\r\n\r\n"
    ).encode()
    for _ in range(n):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(sock_path))
            sock.sendall(head + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        outcome = None
        if answer.startswith(b"HTTP/1.1 200 "):
            outcome = json.loads(answer.partition(b"\r\n\r\n")[2])["result"]["outcome"]
        if outcome != "denied":
            raise SystemExit(f"a run to keep was not denied: {answer[:300]!r}")


def _service_runs(home: Path) -> int:
    import sqlite3

    with sqlite3.connect(home / "service.sqlite3") as db:
        (count,) = db.execute("SELECT count(*) FROM owned WHERE kind = 'run'").fetchone()
    return int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--against", type=Path, metavar="TREE")
    parser.add_argument("--kept", type=int, default=0, metavar="N")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the namespaces backend as root)")
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        home = Path(tmp)
        os.chmod(home, 0o700)
        proc = _start(home)
        try:
            key = subprocess.run(
                # No quota in the way of the rounds (two runs each).
                [*SANDCELL, "tenants", "add", "bench", "--profile", "strict",
                 "--runs-per-minute", "100000"],
                env={**os.environ, "SANDCELL_HOME": str(home)},
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            base_env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
            # Bytecode cached, as in an installation: compiling the sources on every call
            # (PYTHONDONTWRITEBYTECODE, or a tree whose .pyc files are stale) is not the CLI's
            # cost. The warm-up calls fill this cache.
            base_env.pop("PYTHONDONTWRITEBYTECODE", None)
            base_env["PYTHONPYCACHEPREFIX"] = str(home / "pycache")
            env = {**base_env, "SANDCELL_HOME": str(home)}
            served = {**env, "SANDCELL_API_KEY": key}
            cases = {
                "python3 -c pass": ([sys.executable, "-c", "pass"], base_env),
                "sandcell run -c pass, service up": ([*COMMAND, "run", "-c", "pass"], served),
                "sandcell run -c pass, in-process": (
                    [*COMMAND, "run", "-c", "pass", "--no-service"],
                    env,
                ),
            }
            against = f"sandcell run -c pass, service up, {opts.against}"
            if opts.against is not None:
                tree = opts.against.resolve()
                cases[against] = (
                    [*_tree_command(tree), "run", "-c", "pass"],
                    {**served, "PYTHONPATH": str(tree / "src")},
                )
            for argv, case_env in cases.values():  # warm the page cache and the pool
                _timed(argv, case_env)
            _keep_runs(home / "service.sock", key, opts.kept)
            request = "POST /v1/runs alone, from this process"
            _request_ms(home / "service.sock", key)
            before = _service_runs(home)
            samples: dict[str, list[float]] = {name: [] for name in [*cases, request]}
            cpu: dict[str, list[float]] = {name: [] for name in cases}
            sandbox_ms = []
            for _ in range(opts.rounds):
                for name, (argv, case_env) in cases.items():
                    if "service up" in name:
                        time.sleep(_SETTLE_S)
                    took, used = _timed(argv, case_env)
                    samples[name].append(took)
                    cpu[name].append(used)
                time.sleep(_SETTLE_S)
                took, wall = _request_ms(home / "service.sock", key)
                samples[request].append(took)
                sandbox_ms.append(wall)
            sent = _service_runs(home) - before
            sent_each = 3 if opts.against is not None else 2
            if sent != sent_each * opts.rounds:
                raise SystemExit(
                    f"the service has {sent} runs of {sent_each * opts.rounds} sent to it"
                )
            medians = {name: statistics.median(xs) for name, xs in samples.items()}
            base = medians["python3 -c pass"]
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            print(
                f"{opts.rounds} interleaved rounds, load average {load}, "
                f"{opts.kept} finished runs kept before, "
                f"PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}"
            )
            for name, ms in medians.items():
                used = f", CPU {statistics.median(cpu[name]):6.1f} ms" if name in cpu else ""
                print(
                    f"  {name:<36} median {ms:7.1f} ms  ({ms / base:4.1f}x python3 -c pass){used}"
                )
            up_name = "sandcell run -c pass, service up"
            up = medians[up_name]
            local = medians["sandcell run -c pass, in-process"]
            print(f"service up: {up / base:.2f}x python3 -c pass (target: at most 2x)")
            own = up - medians[request]
            print(
                f"  of which the service's answer {medians[request]:.1f} ms (the warm sandbox's "
                f"own wall time in it {statistics.median(sandbox_ms):.1f} ms), the CLI's own "
                f"start {own:.1f} ms ({own / base:.2f}x python3 -c pass)"
            )
            if opts.against is not None:
                them = medians[against]
                cpu_ratio = statistics.median(cpu[up_name]) / statistics.median(cpu[against])
                print(f"against {opts.against}: {them / base:.2f}x python3 -c pass, this tree "
                      f"{up / them:.2f}x of it (CPU {cpu_ratio:.2f}x)")  # fmt: skip
            print(f"in-process: {local:.0f} ms (target: at most 150 ms), {local / base:.1f}x")
            if opts.importtime:
                for name, (argv, case_env) in cases.items():
                    if "run" in argv and name != against:
                        print(f"slowest imports, {name}:")
                        command = [*COMMAND, *argv[argv.index("run") :]]
                        for row in _slowest_imports(command, case_env):
                            print(f"  {row}")
            summary = {
                "baseline_ms": base,
                "service_ms": up,
                "in_process_ms": local,
                "baseline_cpu_ms": statistics.median(cpu["python3 -c pass"]),
                "service_cpu_ms": statistics.median(cpu[up_name]),
            }
            print(json.dumps({**summary, "request_ms": medians[request]}))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
