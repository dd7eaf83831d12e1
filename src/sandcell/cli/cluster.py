"""``sandcell cluster status``: the nodes of a Ray cluster as sandcell places runs on them."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="the Ray cluster runs are placed on (docs/cluster.md)")
    cs = p.add_subparsers(dest="cluster_command", required=True)
    s = cs.add_parser(
        "status", help="each node: rungs, slots, free slots, warm pools, runtimes built"
    )
    s.add_argument(
        "--cluster",
        default="auto",
        metavar="ADDRESS",
        help="'auto' (the cluster this machine is part of, the default), HOST:PORT of its "
        "head, or ray://HOST:PORT",
    )
    s.add_argument("--json", action="store_true", help="one JSON object")


def handle(args: argparse.Namespace) -> int:
    from sandcell.cluster.connect import connect
    from sandcell.cluster.status import cluster_status, render

    ray, connected = connect(args.cluster)
    try:
        rows = cluster_status(ray)
    finally:
        if connected:
            ray.shutdown()
    if args.json:
        print(json.dumps({"nodes": [r.to_dict() for r in rows]}))
    else:
        print(render(rows))
    return 0
