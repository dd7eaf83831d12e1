"""The service against the executor in-process: what HTTP adds to a warm run, and a burst.

    .venv/bin/python bench/bench_service.py [--runs N] [--clients 64] [--burst-s 60]

Runs as root (the namespaces backend as root). Starts ``sandcell serve --start pool`` on a free
loopback port over a fresh home, and in this process an Executor with the same warm pool, then:

1. ``print(1)`` under the strict profile, alternately in-process (``Executor.run``) and over
   HTTP (``POST /v1/runs`` through one kept-alive connection): medians, the difference (target:
   at most 3 ms added) and the ratio, both measured in this run;
2. ``--clients`` HTTP clients at once, each running ``print(i)`` back to back for
   ``--burst-s`` seconds: every answer must be a 200 with the right stdout, and every run must
   have its record (no error, no lost run).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2

from sandcell import Executor, RunRequest, WarmConfig
from sandcell.policy.profiles import load_profile
from sandcell.service.tenants import TenantStore

REPO = Path(__file__).resolve().parents[1]
CODE = "print(1)"
HELD = "import subprocess"
STRICT = load_profile("strict")
"""Loaded once, as the service keeps its profiles: each side pays only for the run."""


def _start(home: Path, pool_size: int, workers: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "SANDCELL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    log = (home / "serve.log").open("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandcell", "serve", "--port", "0", "--start", "pool",
         "--pool-size", str(pool_size), "--workers", str(workers), "--no-socket"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    log.close()
    assert proc.stdout is not None
    found = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
    if found is None:
        proc.kill()
        raise SystemExit(f"the service did not start; see {home / 'serve.log'}")
    url = f"http://127.0.0.1:{found.group(1)}"
    for _ in range(600):
        try:
            httpx2.get(f"{url}/healthz", timeout=5)
            return proc, url
        except httpx2.TransportError:
            time.sleep(0.1)
    raise SystemExit("the service never answered")


class _Client:
    """A lean HTTP/1.1 client on one kept-alive connection (the standard library's), so that
    what is measured is the service, not a client library's own cost per request."""

    def __init__(self, url: str, key: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self._conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self._connect()
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def _connect(self) -> None:
        self._conn.close()
        self._conn.connect()
        assert self._conn.sock is not None
        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def run(self, code: str) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"code": code})
        try:
            self._conn.request("POST", "/v1/runs", body=body, headers=self._headers)
            answer = self._conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closes a connection idle for 5 s (uvicorn's keep-alive), which a
            # pause on a loaded host can reach: connect again, once.
            self._connect()
            self._conn.request("POST", "/v1/runs", body=body, headers=self._headers)
            answer = self._conn.getresponse()
        return answer.status, json.loads(answer.read())

    def close(self) -> None:
        self._conn.close()


def _median_p90(times: list[float]) -> str:
    s = sorted(times)
    return f"median {statistics.median(s):7.2f} ms   p90 {s[int(len(s) * 0.9) - 1]:7.2f} ms"


def _latency(ex: Executor, client: _Client, runs: int, pause: float) -> None:
    request = RunRequest(code=CODE)
    local: list[float] = []
    remote: list[float] = []
    for i in range(runs + 3):
        # Each pool refills after a run: let it, so neither path pays for the other's refill.
        time.sleep(pause)
        t0 = time.perf_counter()
        result = ex.run(request, profile=STRICT)
        t1 = time.perf_counter()
        time.sleep(pause)
        t2 = time.perf_counter()
        _, answer = client.run(CODE)
        t3 = time.perf_counter()
        body = answer["result"]
        if result.stdout != "1\n" or body["stdout"] != "1\n":
            raise SystemExit(f"a run failed: {result.reason!r} / {body['reason']!r}")
        if i >= 3:  # the first runs fill the pools and warm both paths
            local.append((t1 - t0) * 1000)
            remote.append((t3 - t2) * 1000)
    starts = {body["start"]["mode"], result.start.mode}
    added = statistics.median(remote) - statistics.median(local)
    print(f"warm run ({CODE!r}, strict, pool start: {sorted(starts)}), {runs} each, interleaved")
    print(f"  in-process Executor.run   {_median_p90(local)}")
    print(f"  HTTP POST /v1/runs        {_median_p90(remote)}")
    paired = statistics.median(r - loc for r, loc in zip(remote, local, strict=True))
    print(
        f"  added by HTTP at the median: {added:+.2f} ms (target <= 3 ms); median of the paired "
        f"differences {paired:+.2f} ms; "
        f"ratio HTTP / in-process {statistics.median(remote) / statistics.median(local):.3f}"
    )


def _overhead(ex: Executor, client: _Client, runs: int) -> None:
    """The same comparison for a run that starts no sandbox (held for approval: admission,
    the approval store and the record only), so the service's own cost shows without the
    sandbox's noise."""
    request = RunRequest(code=HELD)
    local: list[float] = []
    remote: list[float] = []
    for i in range(runs + 3):
        t0 = time.perf_counter()
        result = ex.run(request, profile=STRICT)
        t1 = time.perf_counter()
        status, _ = client.run(HELD)
        t2 = time.perf_counter()
        if result.outcome.value != "awaiting_approval" or status != 200:
            raise SystemExit(f"expected a run held for approval: {result.reason!r}")
        if i >= 3:
            local.append((t1 - t0) * 1000)
            remote.append((t2 - t1) * 1000)
    paired = statistics.median(r - loc for r, loc in zip(remote, local, strict=True))
    print(f"no sandbox ({HELD!r}, held for approval), {runs} each, interleaved")
    print(f"  in-process Executor.run   {_median_p90(local)}")
    print(f"  HTTP POST /v1/runs        {_median_p90(remote)}")
    print(f"  added by the service: median of the paired differences {paired:+.2f} ms")


def _burst(url: str, key: str, clients: int, seconds: float) -> list[str]:
    ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    latencies: list[float] = []

    def client(n: int) -> None:
        with httpx2.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300
        ) as c:
            i = 0
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    answer = c.post("/v1/runs", json={"code": f"print({n * 100000 + i})"})
                except httpx2.HTTPError as exc:
                    with lock:
                        errors.append(f"client {n}: {exc!r}")
                    return
                elapsed = (time.perf_counter() - t0) * 1000
                ok = answer.status_code == 200 and answer.json()["result"]["stdout"] == (
                    f"{n * 100000 + i}\n"
                )
                with lock:
                    if ok:
                        ids.append(answer.json()["id"])
                        latencies.append(elapsed)
                    else:
                        errors.append(f"client {n}: {answer.status_code} {answer.text[:200]}")
                i += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    print(f"burst: {clients} clients for {seconds:.0f} s ({wall:.1f} s with the last answers)")
    print(f"  runs answered ok: {len(ids)} ({len(ids) / wall:.1f} runs/s); errors: {len(errors)}")
    if latencies:
        tail = sorted(latencies)[max(0, math.ceil(len(latencies) * 0.99) - 1)]
        print(f"  latency per run under load: {_median_p90(latencies)}   p99 {tail:7.2f} ms")
    for line in errors[:5]:
        print(f"  error: {line}")
    return ids if not errors else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--pause", type=float, default=0.25, help="seconds between runs (pools refill)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--burst-s", type=float, default=60.0, help="0: no burst")
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the namespaces backend as root)")
    # Each HTTP run hands off between threads (event loop, worker, event loop); on a host
    # with more runnable processes than cores every hand-off waits for a time slice.
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        home = Path(tmp)
        with TenantStore.in_home(home) as store:
            _, key = store.add(
                "bench",
                profiles=["strict"],
                max_concurrent=args.clients + 1,
                runs_per_minute=1_000_000,
                cpu_seconds_per_day=10_000_000,
                max_stored_bytes=1 << 30,
            )
        proc, url = _start(home, args.pool_size, args.workers)
        try:
            warm = WarmConfig(mode="pool", pool_size=args.pool_size)
            client = _Client(url, key)
            with Executor(home=home / "local", warm=warm) as ex:
                _latency(ex, client, args.runs, args.pause)
                _overhead(ex, client, args.runs)
            client.close()
            if args.burst_s > 0:
                ids = _burst(url, key, args.clients, args.burst_s)
                with httpx2.Client(
                    base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
                ) as client:
                    lost = [i for i in ids if client.get(f"/v1/audit/{i}").status_code != 200]
                print(f"  runs without a record (lost): {len(lost)} of {len(ids)}")
                if lost or not ids:
                    raise SystemExit(1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(300)


if __name__ == "__main__":
    main()
