"""host/workspace_archive.py on real directories: what a files-only pause keeps, and the hostile
archives it refuses without writing outside the destination (tar files crafted by hand)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandcell.backends.host.workspace_archive import Bounds, link_stays_inside, pack, unpack
from sandcell.errors import ConfigError, InfraError

BOUNDS = Bounds(max_bytes=1 << 20, max_entries=100)


def _tree(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "notes.txt").write_text("hello\n")
    (root / "d" / "e" / "deep.bin").write_bytes(bytes(range(256)))
    run = root / "run.sh"
    run.write_text("echo hi\n")
    run.chmod(0o4755)  # set-uid: never kept
    (root / "pw").symlink_to("/etc/passwd")
    (root / "d" / "rel").symlink_to("e/deep.bin")
    (root / "d" / "up").symlink_to("../../outside")
    os.mkfifo(root / "fifo")
    (root / bytes.fromhex("fffe").decode(errors="surrogateescape")).write_bytes(b"odd name")


def test_round_trip_keeps_files_dirs_and_inside_links(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _tree(src)
    packed = pack(src, tmp_path / "w.tar", bounds=BOUNDS)
    assert (packed.files, packed.directories, packed.links) == (4, 2, 1)
    assert packed.left_out == 3  # the absolute link, the climbing link, the fifo
    assert stat.S_IMODE((tmp_path / "w.tar").stat().st_mode) == 0o600
    made = unpack(tmp_path / "w.tar", dst, bounds=BOUNDS)
    assert (made.files, made.directories, made.links, made.bytes) == (4, 2, 1, packed.bytes)
    assert (dst / "notes.txt").read_text() == "hello\n"
    assert (dst / "d" / "e" / "deep.bin").read_bytes() == bytes(range(256))
    assert os.readlink(dst / "d" / "rel") == "e/deep.bin"
    assert not os.path.lexists(dst / "pw") and not os.path.lexists(dst / "d" / "up")
    assert not os.path.lexists(dst / "fifo")
    assert stat.S_IMODE((dst / "run.sh").stat().st_mode) == 0o755
    odd = dst / bytes.fromhex("fffe").decode(errors="surrogateescape")
    assert odd.read_bytes() == b"odd name"
    assert (dst / "notes.txt").stat().st_mtime == int((src / "notes.txt").stat().st_mtime)


def test_unpack_gives_the_owner_the_use_of_what_it_gets(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "ro").mkdir(parents=True)
    (src / "ro" / "f").write_text("x")
    (src / "ro" / "f").chmod(0o444)
    (src / "ro").chmod(0o555)
    dst.mkdir()
    try:
        pack(src, tmp_path / "w.tar", bounds=BOUNDS)
    finally:
        (src / "ro").chmod(0o755)
    unpack(tmp_path / "w.tar", dst, bounds=BOUNDS)
    assert stat.S_IMODE((dst / "ro").stat().st_mode) == 0o755
    assert stat.S_IMODE((dst / "ro" / "f").stat().st_mode) == 0o644


def test_pack_refuses_a_workspace_beyond_its_bounds(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(b"x" * 2048)
    with pytest.raises(ConfigError, match="beyond the workspace's limit"):
        pack(src, tmp_path / "w.tar", bounds=Bounds(max_bytes=1024, max_entries=10))
    assert not (tmp_path / "w.tar").exists()


def test_pack_needs_a_new_archive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "w.tar").write_text("there already")
    with pytest.raises(InfraError):
        pack(src, tmp_path / "w.tar", bounds=BOUNDS)
    assert (tmp_path / "w.tar").read_text() == "there already"


def _crafted(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if data else None)


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([(_entry("../escape"), b"x")], "entry named"),
        ([(_entry("/abs"), b"x")], "entry named"),
        ([(_entry("a/./b"), b"x")], "entry named"),
        ([(_entry("l", tarfile.SYMTYPE, "TARGET"), b""), (_entry("l/owned"), b"x")], "outside"),
        ([(_entry("l", tarfile.SYMTYPE, "../x"), b"")], "outside"),
        ([(_entry("f"), b"x"), (_entry("h", tarfile.LNKTYPE, "f"), b"")], "neither"),
        ([(_entry("dev", tarfile.CHRTYPE), b"")], "neither"),
        ([(_entry("nodir/f"), b"x")], "comes before its directory"),
        ([(_entry("f"), b"x"), (_entry("f"), b"y")], "twice"),
        ([(_entry("big"), b"x" * 4096)], "beyond the workspace's limit"),
    ],
    ids=[
        "dotdot",
        "absolute-name",
        "dot",
        "absolute-link-then-through",
        "climbing-link",
        "hard-link",
        "device",
        "no-parent",
        "twice",
        "too-big",
    ],
)
def test_unpack_refuses_a_hostile_archive(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str
) -> None:
    target = tmp_path / "host-dir"
    target.mkdir()
    for info, _ in members:
        info.linkname = info.linkname.replace("TARGET", str(target))
    _crafted(tmp_path / "bad.tar", *members)
    dst = tmp_path / "ws" / "dst"
    dst.mkdir(parents=True)
    with pytest.raises(ConfigError, match=why):
        unpack(tmp_path / "bad.tar", dst, bounds=Bounds(max_bytes=1024, max_entries=10))
    assert list(target.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["dst"]
    assert not os.path.lexists(tmp_path / "escape") and not os.path.lexists("/abs")


def test_unpack_refuses_a_compressed_or_foreign_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    with tarfile.open(tmp_path / "w.tgz", "w:gz") as tar:
        tar.add(src / "f", arcname="f")
    dst = tmp_path / "dst"
    dst.mkdir()
    with pytest.raises(ConfigError, match="not a readable tar"):
        unpack(tmp_path / "w.tgz", dst, bounds=BOUNDS)
    (tmp_path / "link.tar").symlink_to(tmp_path / "w.tgz")
    with pytest.raises(ConfigError, match="cannot be read"):
        unpack(tmp_path / "link.tar", dst, bounds=BOUNDS)


@pytest.mark.parametrize(
    ("parts", "target", "inside"),
    [
        (("a",), "b", True),
        (("d", "a"), "../b", True),
        (("a",), "../b", False),
        (("d", "a"), "../../b", False),
        (("a",), "/etc/passwd", False),
        (("a",), "", False),
        (("d", "a"), "x/../../b", True),
    ],
)
def test_link_stays_inside(parts: tuple[str, ...], target: str, inside: bool) -> None:
    assert link_stays_inside(parts, target) is inside


def test_an_empty_workspace_round_trips(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    assert pack(tmp_path / "src", tmp_path / "w.tar", bounds=BOUNDS).files == 0
    assert unpack(tmp_path / "w.tar", tmp_path / "dst", bounds=BOUNDS).files == 0
    assert list((tmp_path / "dst").iterdir()) == []
