"""The guest image's pieces: the initramfs archive, the manifest and its verification, the
file sink for what the guest sends back, and the snapshot checks."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from sandcell.backends.microvm import image, initramfs, machine, qemu, snapshot
from sandcell.backends.microvm.transfer import FileSink, TransferError, check_path
from sandcell.errors import InfraError, IsolationUnavailable


def _parse_cpio(data: bytes) -> dict[str, tuple[int, bytes]]:
    out: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode()
        data_start = (name_start + namesize + 3) & ~3
        body = data[data_start : data_start + size]
        pos = (data_start + size + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, body)


def test_initramfs_holds_init_busybox_modules_and_a_console() -> None:
    mods = {m: f"module {m}".encode() for m in initramfs.MODULE_ORDER}
    archive = initramfs.cpio_newc(initramfs.entries(b"BUSYBOX", mods))
    assert len(archive) % 512 == 0
    members = _parse_cpio(archive)
    mode, init = members["init"]
    assert stat.S_ISREG(mode) and mode & 0o111
    text = init.decode()
    assert "insmod /lib/modules/$m.ko" in text and initramfs.AGENT_PATH in text
    assert "ro,noload" in text
    assert members["bin/busybox"][1] == b"BUSYBOX"
    assert stat.S_ISCHR(members["dev/console"][0])
    assert members["lib/modules/virtio_mmio.ko"][1] == b"module virtio_mmio"
    with pytest.raises(ValueError, match="virtio_blk"):
        initramfs.entries(b"B", {m: b"" for m in initramfs.MODULE_ORDER if m != "virtio_blk"})


def _fake_vm_dir(tmp_path: Path) -> Path:
    base = tmp_path / "vm"
    (base / "kernel").mkdir(parents=True)
    (base / "image").mkdir()
    blobs = {
        base / "kernel" / "vmlinuz": b"kernel",
        base / "image" / "initrd.cpio": b"initrd",
        base / "image" / "root.ext4": b"image",
    }
    for path, data in blobs.items():
        path.write_bytes(data)
    manifest = image.Manifest(
        format=image.FORMAT,
        kernel_release="6.1.0-test",
        kernel_sha256=hashlib.sha256(b"kernel").hexdigest(),
        initrd_sha256=hashlib.sha256(b"initrd").hexdigest(),
        image_sha256=hashlib.sha256(b"image").hexdigest(),
        image_bytes=5,
        runtime_sha256="r",
        runtime_identity="test",
        python="/usr/bin/python3",
        bash="/usr/bin/bash",
        built_at="2026-01-01T00:00:00+00:00",
        agent_sha256=image.agent_sha256(),
    )
    (base / "image" / "manifest.json").write_text(json.dumps(asdict(manifest)))
    return base


def test_verify_accepts_the_built_files_and_refuses_a_tampered_image(tmp_path: Path) -> None:
    base = _fake_vm_dir(tmp_path)
    files = image.verify(base)
    assert files.manifest.kernel_release == "6.1.0-test"
    assert image.verify(base).image == base / "image" / "root.ext4"  # from the stat cache
    target = base / "image" / "root.ext4"
    target.write_bytes(b"imagE")  # same size, other bytes: the stat cache must not hide it
    with pytest.raises(IsolationUnavailable, match="tampered"):
        image.verify(base)


@pytest.mark.parametrize("recorded", ["", "0" * 64])
def test_verify_refuses_an_image_with_another_guest_agent(tmp_path: Path, recorded: str) -> None:
    # An image from before the agent's hash was recorded (""), or from another sandcell
    # version: its agent may speak another protocol, so it is refused with the rebuild command.
    base = _fake_vm_dir(tmp_path)
    path = base / "image" / "manifest.json"
    doc = json.loads(path.read_text())
    if recorded:
        doc["agent_sha256"] = recorded
    else:
        del doc["agent_sha256"]
    path.write_text(json.dumps(doc))
    with pytest.raises(IsolationUnavailable, match="another version") as info:
        image.verify(base)
    assert "sandcell vm build" in info.value.fix


def test_verify_names_the_fix_when_nothing_is_built(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable) as info:
        image.verify(tmp_path / "empty")
    assert "sandcell vm build" in info.value.fix
    base = _fake_vm_dir(tmp_path)
    (base / "kernel" / "vmlinuz").unlink()
    with pytest.raises(IsolationUnavailable, match="missing"):
        image.verify(base)


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "a/../b", "a//b", ".", "a/./b", "x\x00y", "n" * 256, "a/" * 70 + "b"],
)
def test_guest_paths_that_are_refused(path: str) -> None:
    with pytest.raises(TransferError):
        check_path(path)


def test_file_sink_writes_only_fresh_regular_files_within_budget(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out", max_bytes=10, max_entries=5)
    sink.header(json.dumps({"path": "d/a.txt", "type": "file", "size": 3}).encode())
    sink.data(b"abc")
    assert (tmp_path / "out" / "d" / "a.txt").read_bytes() == b"abc"
    with pytest.raises(TransferError, match="cannot create"):
        sink.header(json.dumps({"path": "d/a.txt", "type": "file", "size": 1}).encode())
    with pytest.raises(TransferError, match="over 10 bytes"):
        sink.header(json.dumps({"path": "big", "type": "file", "size": 100}).encode())
    with pytest.raises(TransferError, match="unknown entry type"):
        sink.header(json.dumps({"path": "l", "type": "symlink", "size": 0}).encode())
    sink.header(json.dumps({"path": "b", "type": "file", "size": 1}).encode())
    with pytest.raises(TransferError, match="longer than"):
        sink.data(b"xy")
    sink.close()
    # A link planted where a directory goes is never followed.
    os.symlink(tmp_path, tmp_path / "out" / "evil")
    sink2 = FileSink.__new__(FileSink)
    sink2.__init__(tmp_path / "out2", max_bytes=10, max_entries=5)  # type: ignore[misc]
    os.symlink(tmp_path, tmp_path / "out2" / "evil")
    with pytest.raises(TransferError, match="cannot create directory"):
        sink2.header(json.dumps({"path": "evil/x", "type": "file", "size": 1}).encode())
    assert not (tmp_path / "x").exists()


def _guest(tmp_path: Path) -> machine.Guest:
    base = _fake_vm_dir(tmp_path)
    return machine.Guest(
        files=image.verify(base),
        qemu=qemu.Qemu(path="/usr/bin/qemu-system-x86_64", version="7.2.22", version_text="x"),
        accel="tcg",
        tsc_khz=2100000,
    )


def test_snapshot_refused_when_changed_or_taken_with_another_command_line(tmp_path: Path) -> None:
    guest = _guest(tmp_path)
    d = tmp_path / "snap"
    d.mkdir()
    (d / "ram").write_bytes(b"\x00" * 4096)
    (d / "state").write_bytes(b"device state")
    run_dir = tmp_path / "run"
    vplan = machine.plan(guest, run_dir, memory_mib=704, ram_file=d / "ram", incoming=True)
    snap = snapshot.Snapshot(
        id="t",
        dir=d,
        memory_mib=704,
        preload=(),
        identity=tuple(qemu.snapshot_identity(vplan)),
        qemu_version="7.2.22",
        state_sha256=hashlib.sha256(b"device state").hexdigest(),
        ram_key=snapshot._ram_key(d / "ram"),
        image_sha256=guest.files.manifest.image_sha256,
    )
    snapshot.check(snap, guest, vplan)
    with pytest.raises(InfraError, match="another QEMU command line"):
        snapshot.check(snap, guest, replace(vplan, memory_mib=512))
    newer = replace(guest, qemu=replace(guest.qemu, version="8.0.0"))
    with pytest.raises(InfraError, match=r"QEMU 7\.2\.22"):
        snapshot.check(snap, newer, vplan)
    (d / "state").write_bytes(b"device statE")
    with pytest.raises(InfraError, match="tampered"):
        snapshot.check(snap, guest, vplan)
    (d / "state").write_bytes(b"device state")
    with open(d / "ram", "r+b") as f:
        f.write(b"\x01")
    with pytest.raises(InfraError, match="tampered"):
        snapshot.check(snap, guest, vplan)


def test_stand_ins_let_the_host_checks_refuse_what_the_guest_did_not_send(tmp_path: Path) -> None:
    from sandcell.artifacts import ArtifactStore, ExportLimits, collect_exports, validate_globs

    sink = FileSink(tmp_path / "out", max_bytes=100, max_entries=10)
    assert sink.stand_in("d/link.txt", "symlink")
    assert sink.stand_in("d/pipe.txt", "special")
    assert sink.stand_in("d/sock.txt", "socket")
    assert sink.stand_in("d/huge.txt", "oversized", 10 << 30)
    assert not sink.stand_in("d/x.txt", "device-of-my-choosing")
    assert not sink.stand_in("../escape", "symlink")
    assert not sink.stand_in("d/neg.txt", "oversized", -1)
    sink.header(json.dumps({"path": "d/hard.txt", "type": "file", "size": 2, "nlink": 2}).encode())
    sink.data(b"hi")
    sink.close()
    link = tmp_path / "out" / "d" / "link.txt"
    assert os.readlink(link) == "sandcell: a symbolic link in the guest, not followed"
    assert (tmp_path / "out" / "d" / "huge.txt").stat().st_blocks == 0
    assert sink.stand_ins == {"d/link.txt", "d/pipe.txt", "d/sock.txt", "d/huge.txt"}
    store = ArtifactStore(tmp_path / "store")
    artifacts, rejected = collect_exports(
        tmp_path / "out", validate_globs(["d/*"]), store, ExportLimits()
    )
    assert artifacts == ()
    reasons = {r.path: r.reason for r in rejected}
    assert "symbolic link" in reasons["d/link.txt"]
    assert "FIFO" in reasons["d/pipe.txt"]
    assert "socket" in reasons["d/sock.txt"]
    assert "per-file cap" in reasons["d/huge.txt"]
    assert "hard link" in reasons["d/hard.txt"]


def test_the_guest_package_is_compiled_into_the_image() -> None:
    """pid 1 imports its package from bytecode built in the image (a read-only root caches
    nothing, and compiling every module at each cold boot costs TCG time): one unchecked
    hash-based file per module, where the guest's interpreter (this one's) looks, compiled from
    the module the image also holds, naming the guest path in its tracebacks."""
    import importlib.util
    import marshal

    generated = {path: data for path, data, _mode in image.plan_root().generated}
    sources = sorted(
        p for p in generated if p.startswith("/opt/sandcell/guest/") and p.endswith(".py")
    )
    assert len(sources) > 5, sources
    for source in sources:
        pyc = importlib.util.cache_from_source(source)
        data = generated.get(pyc)
        assert data is not None, f"no bytecode for {source}"
        assert data[:4] == importlib.util.MAGIC_NUMBER
        flags = int.from_bytes(data[4:8], "little")
        assert flags == 0b01, "hash-based, unchecked: the image is rebuilt with its sources"
        assert data[8:16] == importlib.util.source_hash(generated[source])
        code = marshal.loads(data[16:])
        assert code.co_filename == source
