"""``sandcell packages add|list|verify|remove``: the local wheel cache, prepared ahead of time.

``add`` is the only sandcell command that uses the network (pip, on the host, never in a run).
Exit status: 0 when done (``verify``: when the cache is intact), 1 when ``verify`` found problems
or ``remove`` found nothing to remove, 78 for an unpinned or unsafe package, 75 when pip could not
reach the index.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandcell.executor import data_dir
from sandcell.packages import (
    CachedPackage,
    WheelCache,
    check_runtime_lock,
    write_runtime_lock,
)
from sandcell.validation import neutralise


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("packages", help="the local wheel cache of packages beyond the runtime")
    psub = p.add_subparsers(dest="packages_command", required=True)
    pa = psub.add_parser(
        "add", help="download pinned wheels (NAME==VERSION, no dependencies) into the cache"
    )
    pa.add_argument("requirements", nargs="*", metavar="NAME==VERSION")
    pa.add_argument(
        "--wheel", type=Path, action="append", default=[], help="a local .whl file (repeatable)"
    )
    pl = psub.add_parser("list", help="the cached packages: name, version, imports, sha256")
    pl.add_argument("--json", action="store_true")
    psub.add_parser("verify", help="re-hash the kept wheels and the extracted trees")
    pr = psub.add_parser("remove", help="drop packages from the cache")
    pr.add_argument("names", nargs="+", metavar="NAME")
    rl = psub.add_parser(
        "lock-runtime", help="write the runtime's pinned lock (name==version and record hashes)"
    )
    rl.add_argument("file", type=Path)
    rc = psub.add_parser(
        "check-runtime", help="compare the runtime with a lock written by lock-runtime"
    )
    rc.add_argument("file", type=Path)


def _cache(args: argparse.Namespace) -> WheelCache:
    home = getattr(args, "home", None) or data_dir()
    return WheelCache(Path(home) / "wheels")


def _line(p: CachedPackage) -> str:
    # Names and imports come from a downloaded file: shown with terminal controls escaped.
    imports = ", ".join(p.imports) or "-"
    return neutralise(f"{p.name} {p.version}  imports: {imports}  sha256: {p.sha256[:12]}")


def handle(args: argparse.Namespace) -> int:
    cache = _cache(args)
    command = args.packages_command
    if command == "lock-runtime":
        write_runtime_lock(args.file)
        print(f"runtime lock written to {args.file}")
        return 0
    if command == "check-runtime":
        drift = check_runtime_lock(args.file)
        for line in drift:
            print(neutralise(line))
        if not drift:
            print(f"the runtime matches {args.file}")
        return 1 if drift else 0
    if command == "add":
        if not args.requirements and not args.wheel:
            print("sandcell: packages add: give NAME==VERSION or --wheel FILE", file=sys.stderr)
            return 2
        added = cache.prepare(args.requirements) if args.requirements else []
        added += cache.prepare_files(args.wheel) if args.wheel else []
        for p in added:
            print(_line(p))
            if p.requires:
                # --no-deps: what it needs has to be added (and allowed) by name as well.
                print(f"  requires: {', '.join(p.requires)} (add and allow these too)")
        return 0
    if command == "list":
        packages = cache.packages()
        if args.json:
            print(json.dumps([p.to_dict() for p in packages]))
            return 0
        for p in packages:
            print(_line(p))
        if not packages:
            print(f"no packages in {cache.root}", file=sys.stderr)
        return 0
    if command == "verify":
        problems = cache.verify()
        for problem in problems:
            print(neutralise(problem))
        if problems:
            return 1
        print(f"wheel cache OK: {len(cache.packages())} packages in {cache.root}")
        return 0
    missing = [n for n in args.names if not cache.remove(n)]
    for name in missing:
        print(f"sandcell: {name} is not in the wheel cache", file=sys.stderr)
    return 1 if missing else 0
