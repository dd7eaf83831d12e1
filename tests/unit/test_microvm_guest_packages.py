"""What a microVM is sent of a run's cache packages: verified bytes, their RAM cost, the frames."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.test_packages import make_wheel

from sandcell.backends.microvm import channel, guest_packages
from sandcell.errors import ConfigError
from sandcell.packages import CachedPackage, WheelCache

MiB = 1 << 20


def _cached(tmp_path: Path, **files: bytes) -> CachedPackage:
    wheel = make_wheel(tmp_path / "wheel", files=files or {"tinypkg/__init__.py": b"VALUE = 1\n"})
    [pkg] = WheelCache(tmp_path / "cache").prepare_files([wheel])
    return pkg


def test_load_reads_every_entry_under_the_package_name(tmp_path: Path) -> None:
    pkg = _cached(tmp_path, **{"tinypkg/__init__.py": b"A = 1\n", "tinypkg/sub/m.py": b"B = 2\n"})
    got = guest_packages.load([pkg.path])
    assert got.names == ("tinypkg-1.0",)
    files = {e.path: e.data for e in got.entries}
    assert files["tinypkg-1.0"] is None and files["tinypkg-1.0/tinypkg/sub"] is None
    assert files["tinypkg-1.0/tinypkg/__init__.py"] == b"A = 1\n"
    assert files["tinypkg-1.0/tinypkg/sub/m.py"] == b"B = 2\n"
    assert "tinypkg-1.0/tinypkg-1.0.dist-info/RECORD" in files
    # Parents come before what they hold: the agent creates them in order.
    order = [e.path for e in got.entries]
    assert order.index("tinypkg-1.0/tinypkg/sub") < order.index("tinypkg-1.0/tinypkg/sub/m.py")


def test_frames_carry_the_packages_area_and_the_bytes(tmp_path: Path) -> None:
    pkg = _cached(tmp_path, **{"tinypkg/__init__.py": b"y" * (channel.MAX_FRAME + 10)})
    got = guest_packages.load([pkg.path])
    reader = channel.FrameReader(allowed=frozenset({channel.INPUT, channel.DATA}))
    frames = reader.feed(b"".join(got.frames()))
    assert not reader.buf
    headers = [json.loads(p) for k, p in frames if k == channel.INPUT]
    assert headers[0] == {"path": "tinypkg-1.0", "type": "dir", "size": 0, "area": "packages"}
    assert all(h["area"] == "packages" for h in headers)
    at = next(
        i for i, (k, p) in enumerate(frames)
        if k == channel.INPUT and json.loads(p)["path"] == "tinypkg-1.0/tinypkg/__init__.py"
    )  # fmt: skip
    assert json.loads(frames[at][1])["size"] == channel.MAX_FRAME + 10
    # One file's bytes, split across frames of at most MAX_FRAME.
    assert [len(p) for _, p in frames[at + 1 : at + 3]] == [channel.MAX_FRAME, 10]
    assert frames[at + 1][1] + frames[at + 2][1] == b"y" * (channel.MAX_FRAME + 10)


def test_a_file_changed_after_the_tree_check_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _cached(tmp_path)
    module = pkg.path / "tinypkg" / "__init__.py"

    def check_then_change(tree: Path, record: str | None = None) -> list[str]:
        module.write_bytes(b"import os; os.system('id')\n")
        return []

    monkeypatch.setattr(guest_packages, "tree_problems", check_then_change)
    with pytest.raises(ConfigError, match=r"tinypkg/__init__.py does not match its wheel's RECORD"):
        guest_packages.load([pkg.path])


def test_a_link_in_the_tree_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _cached(tmp_path)
    monkeypatch.setattr(guest_packages, "tree_problems", lambda tree, record=None: [])
    (pkg.path / "tinypkg" / "passwd.py").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="not a regular file"):
        guest_packages.load([pkg.path])


def test_the_ram_cost_decides_pool_or_cold(tmp_path: Path) -> None:
    pkg = _cached(tmp_path, **{"tinypkg/__init__.py": b"x" * (3 * MiB)})
    got = guest_packages.load([pkg.path])
    assert 3 * MiB < got.guest_bytes < 5 * MiB
    assert got.extra_mib == -(-got.guest_bytes // MiB)
    program = 512 * MiB
    room_mib = guest_packages.RESERVED_MIB + program // MiB
    assert got.fits(room_mib + got.extra_mib, program)
    assert not got.fits(room_mib + 1, program)
    assert guest_packages.load([]).fits(room_mib, program)
    assert guest_packages.load([]).extra_mib == 0


def test_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _cached(tmp_path, **{"tinypkg/__init__.py": b"x" * MiB})
    monkeypatch.setattr(guest_packages, "MAX_BYTES", MiB)
    with pytest.raises(ConfigError, match="guest memory"):
        guest_packages.load([pkg.path])
