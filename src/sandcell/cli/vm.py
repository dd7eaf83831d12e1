"""``sandcell vm``: the microVM backend's guest image.

``sandcell vm build [--runtime NAME]`` builds (or rebuilds) the guest image of a runtime (the
default one: this environment's own; a named one: as ``sandcell runtime build NAME`` stored it),
offline, next to the kernel ``scripts/install-vm`` installed; each runtime has its own image.
``sandcell vm show [--runtime NAME]`` prints the manifest and whether every file still matches
its hash.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from sandcell import status
from sandcell.errors import IsolationUnavailable


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("vm", help="build or show the microVM guest image")
    vm_sub = p.add_subparsers(dest="vm_command", required=True)
    build = vm_sub.add_parser("build", help="build a runtime's guest image (offline)")
    show = vm_sub.add_parser("show", help="show a runtime's guest image and verify its hashes")
    for cmd in (build, show):
        cmd.add_argument(
            "--runtime",
            metavar="NAME",
            default=None,
            help="the runtime the image is of (sandcell runtime list); default: default",
        )
    show.add_argument("--json", action="store_true", help="print one JSON object")


def handle(args: argparse.Namespace) -> int:
    from sandcell.backends.microvm import image, layout, snapshot

    if args.vm_command == "build":
        t0 = time.monotonic()
        idir = layout.image_dir(runtime=args.runtime)
        print(f"building the guest image in {idir} ...", file=sys.stderr)
        manifest = image.build(runtime=args.runtime)
        # This user's saved snapshots of the old build of this image would be refused anyway;
        # those of other VM directories' (and other runtimes') images are theirs.
        snapshot.remove_stale(idir / image.IMAGE_NAME, manifest.image_sha256)
        node = (
            f"Node runtime {manifest.node_tree_sha256[:12]}"
            if manifest.node_tree_sha256
            else "no Node runtime (JavaScript needs: sandcell runtime build node, then this)"
        )
        print(
            f"built in {time.monotonic() - t0:.0f} s: runtime {manifest.runtime}, {node}, kernel "
            f"{manifest.kernel_release}, image {manifest.image_bytes // (1 << 20)} MiB sha256 "
            f"{manifest.image_sha256}"
        )
        return 0
    try:
        files = image.verify(runtime=args.runtime)
        doc: dict[str, object] = {"verified": True, **asdict(files.manifest)}
    except IsolationUnavailable as exc:
        doc = {"verified": False, "error": exc.reason, "fix": exc.fix}
    doc["dir"] = str(layout.vm_dir())
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for key, value in doc.items():
            print(f"{key:20} {value}")
    return 0 if doc["verified"] else status.EXIT_CONFIG


__all__ = ["add_parser", "handle"]
