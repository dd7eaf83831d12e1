"""``sandcell vm``: the microVM backend's guest image.

``sandcell vm build`` builds (or rebuilds) the guest image from this environment's runtime,
offline, next to the kernel ``scripts/install-vm`` installed; ``sandcell vm show`` prints the
manifest and whether every file still matches its hash.
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
    vm_sub.add_parser("build", help="build the guest image from this runtime (offline)")
    show = vm_sub.add_parser("show", help="show the guest image and verify its hashes")
    show.add_argument("--json", action="store_true", help="print one JSON object")


def handle(args: argparse.Namespace) -> int:
    from sandcell.backends.microvm import image, layout, snapshot

    if args.vm_command == "build":
        t0 = time.monotonic()
        print(f"building the guest image in {layout.image_dir()} ...", file=sys.stderr)
        manifest = image.build()
        # This user's saved snapshots of the old build of this image would be refused anyway;
        # those of other VM directories' images are theirs.
        snapshot.remove_stale(layout.image_dir() / image.IMAGE_NAME, manifest.image_sha256)
        print(
            f"built in {time.monotonic() - t0:.0f} s: kernel {manifest.kernel_release}, image "
            f"{manifest.image_bytes // (1 << 20)} MiB sha256 {manifest.image_sha256}"
        )
        return 0
    try:
        files = image.verify()
        doc: dict[str, object] = {"verified": True, **asdict(files.manifest)}
    except IsolationUnavailable as exc:
        doc = {"verified": False, "error": exc.reason, "fix": exc.fix}
    doc["dir"] = str(layout.vm_dir())
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        for key, value in doc.items():
            print(f"{key:18} {value}")
    return 0 if doc["verified"] else status.EXIT_CONFIG


__all__ = ["add_parser", "handle"]
