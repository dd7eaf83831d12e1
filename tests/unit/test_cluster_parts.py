"""The parts of cluster placement that need no cluster: bundles, store identity, rungs, and
the choice of a node from what the agents reported."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sandcell.cluster.agent import offered_rungs
from sandcell.cluster.bundles import pack, unpack, visible
from sandcell.cluster.fleet import Member, NodeSpec, choose
from sandcell.cluster.store_id import store_identity
from sandcell.cluster.wire import NodeReport, PoolReport


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


def _member(
    node_id: str,
    *,
    rungs: tuple[str, ...] = ("namespaces",),
    slots: int = 2,
    running: int = 0,
    ready: int = 0,
    sent: int = 0,
) -> Member:
    pools = (PoolReport(rung="namespaces", runtime="default", mode="pool", ready=ready, size=3),)
    report = NodeReport(
        node_id=node_id,
        hostname="h",
        home=f"/homes/{node_id}",
        pid=1,
        rungs=rungs,
        slots=slots,
        running=running,
        queued=0,
        pools=pools if ready else (),
        runtimes=("minimal",),
        store_id="0" * 32,
    )
    spec = NodeSpec(node_id=node_id, address="127.0.0.1", slots=slots, declared_rungs=())
    return Member(spec=spec, actor=None, report=report, sent=sent)


def test_placement_takes_the_rung_then_a_free_slot_then_a_warm_pool_then_the_least_loaded() -> None:
    def chosen(*members: Member, rung: str = "namespaces", only: str | None = None) -> str | None:
        found = choose(members, rung, "default", only=only)
        return found.node_id if found is not None else None

    assert chosen(_member("a"), _member("b", rungs=("gvisor",)), rung="gvisor") == "b"
    assert chosen(_member("a"), rung="microvm") is None
    # A full node only when every node is full; then the least loaded.
    assert chosen(_member("full", running=2, ready=3), _member("free", running=1)) == "free"
    assert chosen(_member("x", running=3), _member("y", running=2)) == "y"
    # Among free nodes, a warm pool before load.
    assert chosen(_member("cold"), _member("warm", running=1, ready=1)) == "warm"
    assert chosen(_member("busy", running=1), _member("idle")) == "idle"
    # Ties go in turn: to the node sent fewer runs.
    assert chosen(_member("many", sent=5), _member("few", sent=1)) == "few"
    # A lost node, or one not allowed, never.
    lost = _member("lost")
    lost.alive = False
    assert chosen(lost, _member("b", running=1)) == "b"
    assert chosen(_member("a"), _member("b", running=1), only="b") == "b"
