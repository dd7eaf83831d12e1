"""What a run's ways out cost on the namespaces backend: a run with sockets (egress proxy and
tool gateway, hence the socket directory, the Landlock port rule and the egress bridge started
before the program) against the same run without, per start mode.

    .venv/bin/python bench/bench_outside_namespaces.py [--runs N] [--modes cold,template,pool]

Interleaved in one process, as root: the backend call (``NamespacesBackend.run``, no policy or
record) of ``print(1)``, with and without sockets, plus the host's own share (``RunSockets.open``
and ``close`` around each run with sockets). Medians in ms and the ratio with/without; no
program here uses the network, so this is the fixed cost of making it reachable.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sandcell import RunRequest, WarmConfig
from sandcell.backends.namespaces import NamespacesBackend
from sandcell.policy.profiles import load_profile
from sandcell.run_sockets import RunSockets

PROFILE = """
[network]
mode = "allowlist"
hosts = ["127.0.0.1:9"]
allow_addresses = ["127.0.0.1/32"]

[tools.echo]
kind = "http"
base_url = "http://127.0.0.1:9"
allow = ["GET /**"]
"""


def _backend(mode: str) -> NamespacesBackend:
    if mode == "cold":
        return NamespacesBackend()
    return NamespacesBackend(warm=WarmConfig(mode=mode, preload=()))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--modes", default="cold,template,pool")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "outside.toml"
        path.write_text(PROFILE)
        profile = load_profile(str(path))
    request = RunRequest(code="print(1)")
    print(f"{'mode':<10}{'without':>10}{'with':>10}{'ratio':>8}{'host share':>12}")
    for mode in args.modes.split(","):
        backend = _backend(mode)
        plain: list[float] = []
        outside: list[float] = []
        host: list[float] = []
        try:
            for i in range(args.runs + 2):  # the first two warm the template and the pool up
                t0 = time.perf_counter()
                result = backend.run(request, run_id=uuid.uuid4().hex, collect=lambda _w: ((), ()))
                t1 = time.perf_counter()
                sockets = RunSockets.open(profile, approver=None, approval_timeout_s=5)
                assert sockets is not None
                t2 = time.perf_counter()
                with_sockets = backend.run(
                    request,
                    run_id=uuid.uuid4().hex,
                    collect=lambda _w: ((), ()),
                    sockets=sockets.sandbox,
                )
                t3 = time.perf_counter()
                sockets.close()
                t4 = time.perf_counter()
                for r in (result, with_sockets):
                    if r.outcome.value != "ok":
                        raise RuntimeError(f"{mode}: {r.outcome} {r.reason} {r.stderr[-300:]!r}")
                if i >= 2:
                    plain.append((t1 - t0) * 1000)
                    outside.append((t3 - t2) * 1000)
                    host.append(((t2 - t1) + (t4 - t3)) * 1000)
        finally:
            backend.close()
        a, b = statistics.median(plain), statistics.median(outside)
        h = statistics.median(host)
        print(f"{mode:<10}{a:>10.1f}{b:>10.1f}{b / a:>8.2f}{h:>12.1f}")


if __name__ == "__main__":
    main()
