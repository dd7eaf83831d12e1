"""``sandcell runtime list|build|show|verify``: the curated environments sandboxed code runs in.

``build`` is the only runtime command that uses the network (pip, on the host, at install time;
``--find-links DIR --no-index`` builds from wheels on disk). Exit status: 0 when done
(``verify``: when the runtime is intact), 1 when ``verify`` found it changed, 78 for a bad lock or
an unknown runtime, 75 when pip could not install the lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandcell.errors import ConfigError, InfraError, IsolationUnavailable
from sandcell.runtimes.node.build import build_node
from sandcell.runtimes.node.locked import NODE_RUNTIME, node_lock
from sandcell.runtimes.store import (
    SHIPPED,
    Lock,
    StoredRuntime,
    build,
    find,
    list_runtimes,
    load_lock,
    runtimes_dir,
    shipped_lock,
    verify,
)
from sandcell.status import EXIT_CONFIG, EXIT_INFRA


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("runtime", help="curated, locked environments that sandboxed code runs in")
    rsub = p.add_subparsers(dest="runtime_command", required=True)
    pl = rsub.add_parser("list", help="the runtimes built on this host, with their hashes")
    pl.add_argument("--json", action="store_true")
    pb = rsub.add_parser(
        "build",
        help=f"build a runtime from its lock ({', '.join((*SHIPPED, NODE_RUNTIME))}, or --lock F)",
    )
    pb.add_argument(
        "name",
        nargs="?",
        help=f"a shipped lock's name ({NODE_RUNTIME}: Node.js and its packages), or the name for "
        "--lock",
    )
    pb.add_argument("--lock", type=Path, help="your own lock file (pip-compile --generate-hashes)")
    pb.add_argument(
        "--find-links", type=Path, help="a directory of wheels to install from instead of an index"
    )
    pb.add_argument("--no-index", action="store_true", help="do not consult any package index")
    pb.add_argument(
        "--force", action="store_true", help="build again even if the same lock is built and intact"
    )
    ps = rsub.add_parser("show", help="a runtime's packages and versions, size and hashes")
    ps.add_argument("name")
    ps.add_argument("--json", action="store_true")
    pv = rsub.add_parser("verify", help="hash a runtime's files again, refusing any change")
    pv.add_argument("names", nargs="*", help="default: every built runtime")


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _summary(s: StoredRuntime) -> dict[str, object]:
    m = s.manifest
    return {
        "name": m.name,
        "tree_sha256": m.tree_sha256,
        "lock_sha256": m.lock_sha256,
        "lock": m.lock_source,
        "kind": m.kind,
        "python": m.implementation,
        "packages": len(m.distributions),
        "files": m.files,
        "size_bytes": m.size_bytes,
        "built_at": m.built_at,
        "path": str(s.tree),
    }


def handle(args: argparse.Namespace) -> int:
    command = args.runtime_command
    if command == "list":
        found = list_runtimes()
        if args.json:
            print(json.dumps([_summary(s) for s in found]))
            return 0
        for s in found:
            m = s.manifest
            print(
                f"{m.name:<14} {m.tree_sha256[:12]}  {len(m.distributions):>3} packages  "
                f"{_mib(m.size_bytes):>8}  lock {m.lock_sha256[:12]} ({m.lock_source})"
            )
        if not found:
            print(
                f"no runtimes built in {runtimes_dir()}; build one with: sandcell runtime build "
                "analysis",
                file=sys.stderr,
            )
        return 0
    if command == "build":
        return _build(args)
    if command == "show":
        s = find(args.name)
        if args.json:
            print(json.dumps({**_summary(s), "distributions": s.manifest.distributions}))
            return 0
        m = s.manifest
        print(f"runtime {m.name}: {m.implementation}, {m.platform}")
        print(f"  tree   sha256:{m.tree_sha256}  {m.files} files, {_mib(m.size_bytes)}")
        print(f"  lock   sha256:{m.lock_sha256}  {m.lock_source}")
        print(f"  built  {m.built_at}  at {s.tree}")
        print(f"  packages ({len(m.distributions)}):")
        sep = "@" if m.kind == "node" else "=="
        for name, version in sorted(m.distributions.items()):
            print(f"    {name}{sep}{version}")
        if not m.distributions:
            print("    none: the standard library only")
        return 0
    names = args.names or [s.manifest.name for s in list_runtimes()]
    failed = 0
    for name in names:
        s = find(name)
        try:
            verify(s, full=True)
        except IsolationUnavailable as exc:
            print(f"sandcell: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"runtime {name} OK: {s.manifest.files} files hash to {s.manifest.tree_sha256[:12]}")
    return 1 if failed else 0


def _up_to_date(lock: Lock) -> bool:
    """Whether ``lock`` is what its name already points at, intact (an install step run twice
    then costs a hash check, not a build)."""
    try:
        stored = find(lock.name)
        if stored.manifest.lock_sha256 != lock.sha256:
            return False
        verify(stored)
    except (ConfigError, IsolationUnavailable):
        return False
    print(f"runtime {lock.name} is built from this lock and intact: {stored.manifest.tree_sha256}")
    return True


def _build(args: argparse.Namespace) -> int:
    if args.name == NODE_RUNTIME or (args.lock is not None and args.lock.stem == NODE_RUNTIME):
        return _build_node(args)
    if args.lock is not None:
        lock = load_lock(args.lock, args.name)
    elif args.name:
        lock = shipped_lock(args.name)
    else:
        print("sandcell: runtime build: name a shipped lock or pass --lock FILE", file=sys.stderr)
        return EXIT_CONFIG
    if not args.force and _up_to_date(lock):
        return 0
    pip_args: list[str] = []
    if args.find_links is not None:
        pip_args += ["--find-links", str(args.find_links)]
    if args.no_index:
        pip_args.append("--no-index")
    base = runtimes_dir()
    print(f"building runtime {lock.name} from {lock.source} into {base} ...", flush=True)
    try:
        stored = build(lock, base, pip_args=pip_args, say=lambda m: print(f"  {m}", flush=True))
    except InfraError as exc:
        print(f"sandcell: {exc}", file=sys.stderr)
        return EXIT_INFRA
    m = stored.manifest
    print(
        f"runtime {m.name}: {len(m.distributions)} packages, {m.files} files, "
        f"{_mib(m.size_bytes)}, sha256 {m.tree_sha256}"
    )
    return 0


def _build_node(args: argparse.Namespace) -> int:
    if args.lock is not None or args.find_links is not None or args.no_index:
        raise ConfigError(
            f"the runtime name {NODE_RUNTIME!r} is the Node runtime, built from the lock that "
            f"ships with sandcell: run 'sandcell runtime build {NODE_RUNTIME}' without --lock, "
            "--find-links or --no-index (npm's own configuration says which registry it uses)"
        )
    lock = node_lock()
    if not args.force and _node_up_to_date(lock.sha256):
        return 0
    base = runtimes_dir()
    print(f"building runtime {NODE_RUNTIME} from {lock.source} into {base} ...", flush=True)
    try:
        stored = build_node(lock, base, say=lambda m: print(f"  {m}", flush=True))
    except (InfraError, IsolationUnavailable) as exc:
        print(f"sandcell: {exc}", file=sys.stderr)
        return EXIT_INFRA
    m = stored.manifest
    print(
        f"runtime {NODE_RUNTIME}: {m.implementation}, {len(m.distributions)} packages, "
        f"{m.files} files, {_mib(m.size_bytes)}, sha256 {m.tree_sha256}"
    )
    return 0


def _node_up_to_date(lock_sha256: str) -> bool:
    try:
        stored = find(NODE_RUNTIME)
        if stored.manifest.kind != "node" or stored.manifest.lock_sha256 != lock_sha256:
            return False
        verify(stored)
    except (ConfigError, IsolationUnavailable):
        return False
    print(
        f"runtime {NODE_RUNTIME} is built from this lock and intact: {stored.manifest.tree_sha256}"
    )
    return True
