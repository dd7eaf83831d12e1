"""The parts of cluster placement that need no cluster: bundles, store identity, rungs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sandcell.cluster.agent import offered_rungs
from sandcell.cluster.bundles import pack, unpack, visible
from sandcell.cluster.store_id import store_identity


def test_a_directory_travels_with_files_modes_and_links(tmp_path: Path) -> None:
    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha")
    (src / "sub" / "run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o755)
    os.symlink("../a.txt", src / "sub" / "link")
    single = tmp_path / "one.bin"
    single.write_bytes(bytes(range(256)))

    bundles = pack([src, single, src])
    assert [b.path for b in bundles] == [str(src), str(single)]
    dest = tmp_path / "there"
    dest.mkdir()
    got = unpack(bundles[0], dest / "data")
    assert (got / "a.txt").read_bytes() == b"alpha"
    assert (got / "sub" / "run.sh").stat().st_mode & 0o111
    assert os.readlink(got / "sub" / "link") == "../a.txt"
    assert unpack(bundles[1], dest / "one.bin").read_bytes() == bytes(range(256))


def test_paths_under_the_shared_directory_do_not_travel(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "inputs").mkdir(parents=True)
    assert visible(shared / "inputs", shared)
    assert not visible(tmp_path / "elsewhere", shared)
    assert not visible(shared / "inputs", None)


def test_one_store_one_identity_even_when_made_at_once(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    seen: list[str] = []
    threads = [threading.Thread(target=lambda: seen.append(store_identity(root))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1
    assert store_identity(root) == seen[0]
    assert store_identity(tmp_path / "other") != seen[0]


def test_a_node_offers_only_rungs_its_probe_passes() -> None:
    probed = ("namespaces", "gvisor")
    assert offered_rungs(probed, ()) == probed
    assert offered_rungs(probed, ("gvisor",)) == ("gvisor",)
    # Declaring a rung the host cannot enforce does not make it offered.
    assert offered_rungs(probed, ("microvm",)) == ()
