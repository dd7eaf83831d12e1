"""``sandcell vm build`` renews only its own image's snapshots: those of another VM directory, and
one a live QEMU still maps, stay."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from sandcell.backends.microvm import image, layout, machine, qemu, snapshot


def _guest(base: Path) -> machine.Guest:
    manifest = image.Manifest(
        format=image.FORMAT,
        kernel_release="6.1.0-test",
        kernel_sha256="k",
        initrd_sha256="i",
        image_sha256="new",
        image_bytes=5,
        runtime_sha256="r",
        runtime_identity="test",
        python="/opt/sandcell/venv/bin/python",
        bash="/usr/bin/bash",
        built_at="2026-01-01T00:00:00+00:00",
    )
    files = image.GuestFiles(
        kernel=base / "kernel" / "vmlinuz",
        initrd=base / "image" / image.INITRD_NAME,
        image=base / "image" / image.IMAGE_NAME,
        manifest=manifest,
    )
    found = qemu.Qemu(path="/usr/bin/qemu-system-x86_64", version="7.2.22", version_text="x")
    return machine.Guest(files=files, qemu=found, accel="tcg", tsc_khz=2100000)


def _saved(root: Path, name: str, guest: machine.Guest, image_sha256: str) -> Path:
    """A shared snapshot as ``snapshot.cached`` leaves it (its meta and files)."""
    d = root / f"cache-{name}"
    d.mkdir(parents=True)
    (d / "ram").write_bytes(b"\x00" * 4096)
    (d / "state").write_bytes(b"state")
    vplan = machine.plan(guest, Path("/"), memory_mib=704, ram_file=d / "ram", incoming=True)
    snap = snapshot.Snapshot(
        id=name,
        dir=d,
        memory_mib=704,
        preload=(),
        identity=tuple(qemu.snapshot_identity(vplan)),
        qemu_version="7.2.22",
        state_sha256="s",
        ram_key=snapshot._ram_key(d / "ram"),
        image_sha256=image_sha256,
    )
    (d / "meta.json").write_text(json.dumps({**asdict(snap), "dir": str(d)}))
    return d


def test_a_rebuild_removes_only_its_own_images_unused_old_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SHM_ROOT", tmp_path / "shm")
    root = layout.snapshots_root()
    mine, other = _guest(tmp_path / "vm-mine"), _guest(tmp_path / "vm-other")
    old_mine = _saved(root, "old-mine", mine, "old")
    current_mine = _saved(root, "current-mine", mine, "new")
    old_other = _saved(root, "old-other", other, "old")
    unreadable = root / "cache-unreadable"
    unreadable.mkdir()
    assert snapshot.image_path(snapshot._load(old_other)) == other.files.image  # type: ignore[arg-type]

    removed = snapshot.remove_stale(mine.files.image, "new")

    assert removed == [str(old_mine)]
    assert not old_mine.exists()
    assert current_mine.is_dir() and old_other.is_dir() and unreadable.is_dir()


def test_a_rebuild_keeps_an_old_snapshot_a_live_qemu_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = shutil.which("qemu-system-x86_64")
    if found is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    monkeypatch.setattr(layout, "SHM_ROOT", tmp_path / "shm")
    mine = _guest(tmp_path / "vm-mine")
    busy = _saved(layout.snapshots_root(), "busy", mine, "old")
    # A real QEMU mapping the snapshot's RAM file private, as a pooled clone does.
    proc = subprocess.Popen(
        [
            found,
            "-M",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "none",
            "-S",
            "-object",
            f"memory-backend-file,id=m,size=4096,mem-path={busy / 'ram'},share=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not snapshot.in_use(busy):
            assert proc.poll() is None, "QEMU exited at start"
            assert time.monotonic() < deadline, "QEMU never showed up"
            time.sleep(0.05)
        assert snapshot.remove_stale(mine.files.image, "new") == []
        assert busy.is_dir()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert snapshot.remove_stale(mine.files.image, "new") == [str(busy)]
    assert not busy.exists()
