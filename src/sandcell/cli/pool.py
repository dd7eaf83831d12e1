"""``sandcell pool``: start a warm template (and pool), wait until it is ready, show its state.

What a long-lived service would hold: the template's pid and memory, how many pre-isolated
sandboxes wait, and the idle memory each costs (PSS and USS from ``/proc/PID/smaps_rollup``).
Everything is ended when the command exits.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from sandcell.errors import ConfigError

MiB = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pool", help="start a warm template and pool, and show their state")
    p.add_argument("--mode", choices=("template", "pool"), default="pool")
    p.add_argument("--size", type=int, default=4, metavar="N", help="pooled sandboxes")
    p.add_argument(
        "--preload",
        default="numpy,pandas",
        help="comma-separated modules the template imports (default: numpy,pandas)",
    )
    p.add_argument("--wait", type=float, default=120.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the state as one JSON object")


def handle(args: argparse.Namespace) -> int:
    from sandcell.backends.registry import create_backend
    from sandcell.backends.warm import WarmConfig, WarmStats

    preload = tuple(m for m in args.preload.split(",") if m)
    config = WarmConfig(mode=args.mode, preload=preload, pool_size=args.size)
    backend = create_backend("namespaces", warm=config)
    try:
        deadline = time.monotonic() + args.wait
        while True:
            stats = backend.warm_stats()
            assert isinstance(stats, WarmStats)
            if stats.pool is None or stats.pool.ready >= stats.pool.size:
                break
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the pool did not fill within {args.wait:g} s: "
                    f"{stats.pool.last_error or 'no error reported'}"
                )
            time.sleep(0.1)
    finally:
        stats = backend.warm_stats()
        backend.close()
    assert isinstance(stats, WarmStats)
    if args.json:
        print(json.dumps(asdict(stats), indent=1, default=str))
        return 0
    print(f"template  {stats.template_id}  pid {stats.template_pid}")
    print(f"          {dict(stats.template_state)}")
    print(f"          PSS {stats.template_pss_bytes / MiB:.1f} MiB")
    if stats.pool is not None:
        p = stats.pool
        n = max(p.ready, 1)
        print(f"pool      {p.ready}/{p.size} ready, {p.forked} forked, {p.refill_errors} errors")
        print(
            f"idle      per sandbox: PSS {p.idle_pss_bytes / n / MiB:.1f} MiB, "
            f"USS {p.idle_uss_bytes / n / MiB:.1f} MiB"
        )
    return 0
