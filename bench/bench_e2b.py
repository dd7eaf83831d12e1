"""The E2B drop-in against sandcell's own client: a sandbox and one cell, through each.

    .venv/bin/python bench/bench_e2b.py [--runs N] [--start cold|pool|template]

Runs as root (the namespaces backend as root). Starts ``sandcell serve`` on a free loopback port
over a fresh home with one tenant, then alternately, ``--runs`` times each (after one warm-up
round):

* E2B: ``Sandbox.create()`` and ``run_code("1+1")`` through the official
  ``e2b_code_interpreter`` SDK (``E2B_API_URL``/``E2B_SANDBOX_URL`` at ``/e2b``);
* sandcell: ``Client.session()`` and ``session.run("1+1")`` through ``sandcell.client``.

Each sandbox is ended after its timing (not timed). Prints the median and p90 of both and their
ratio, measured in the same run on the same service.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from _stats import latency_stats, ratio

from sandcell.client import Client
from sandcell.service.tenants import TenantStore

REPO = Path(__file__).resolve().parents[1]


def _start(home: Path, start: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "SANDCELL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    with (home / "serve.log").open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandcell", "serve", "--port", "0", "--start", start,
             "--no-socket"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
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


def _e2b_once(sandbox_cls: type) -> float:
    t0 = time.perf_counter()
    sbx = sandbox_cls.create()
    text = sbx.run_code("1+1").text
    elapsed = (time.perf_counter() - t0) * 1000
    sbx.kill()
    if text != "2":
        raise SystemExit(f"E2B run_code gave {text!r}, not '2'")
    return elapsed


def _sandcell_once(client: Client) -> float:
    t0 = time.perf_counter()
    session = client.session()
    result = session.run("1+1")
    elapsed = (time.perf_counter() - t0) * 1000
    session.close()
    if not result.outputs or result.outputs[0].data.get("text/plain") != "2":
        raise SystemExit(f"the sandcell cell gave {result.outputs!r}: {result.reason}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--start", default="pool", choices=("cold", "pool", "template"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the service runs the namespaces backend as root")
    from e2b_code_interpreter import Sandbox

    with tempfile.TemporaryDirectory(prefix="bench-e2b-") as tmp:
        home = Path(tmp)
        with TenantStore.in_home(home) as store:
            _, key = store.add(
                "bench",
                profiles=["strict"],
                max_concurrent=4,
                runs_per_minute=100_000,
                cpu_seconds_per_day=1_000_000,
                max_stored_bytes=1 << 30,
            )
        proc, url = _start(home, args.start)
        os.environ.update(E2B_API_URL=f"{url}/e2b", E2B_SANDBOX_URL=f"{url}/e2b", E2B_API_KEY=key)
        e2b: list[float] = []
        own: list[float] = []
        try:
            with Client(url, key) as client:
                for i in range(args.runs + 1):
                    a, b = _e2b_once(Sandbox), _sandcell_once(client)
                    if i:  # the first round warms both paths
                        e2b.append(a)
                        own.append(b)
        finally:
            proc.terminate()
            proc.wait(60)
    sdk, mine = latency_stats(e2b), latency_stats(own)
    print(f"create + run_code('1+1'), {args.runs} runs each, serve --start {args.start}")
    print(f"  E2B SDK (/e2b)      median {sdk.median_ms:8.2f} ms   p90 {sdk.p90_ms:8.2f} ms")
    print(f"  sandcell client     median {mine.median_ms:8.2f} ms   p90 {mine.p90_ms:8.2f} ms")
    times = ratio(sdk.median_ms, mine.median_ms)
    print(f"  E2B / sandcell      median x{times:.2f}" if times is not None else "  no ratio")


if __name__ == "__main__":
    main()
