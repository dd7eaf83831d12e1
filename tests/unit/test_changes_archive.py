"""The change archive a sandbox hands back is hostile input: every way it could name a path
outside the directory, under .git, or an entry of a kind that is not a file, a directory or a
link, is refused before anything is diffed or applied."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from sandcell.changes.diff import check_path, compute
from sandcell.changes.manifest import Entry, Manifest
from sandcell.changes.safety import leaves
from sandcell.errors import ConfigError


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        meta = json.dumps({"version": 1, "deleted": [], "other": []}).encode()
        info = tarfile.TarInfo("meta.json")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _snapshot() -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r:")


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


@pytest.mark.parametrize(
    "name",
    ["files/../escape", "files//etc/passwd", "files/a/../../b", "files/.git/config", "files/"],
)
def test_paths_out_of_the_directory_or_into_git_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"not allowed|under \.git"):
        compute(_archive((_member(name), b"x")), Manifest(entries={}), _snapshot())


@pytest.mark.parametrize(
    ("kind", "link"),
    [(tarfile.LNKTYPE, "calc.py"), (tarfile.CHRTYPE, ""), (tarfile.FIFOTYPE, "")],
)
def test_entries_of_other_kinds_are_refused(kind: bytes, link: str) -> None:
    with pytest.raises(ConfigError, match="unusable kind"):
        compute(_archive((_member("files/x", kind, link), b"")), Manifest(entries={}), _snapshot())


def test_a_stray_member_is_refused() -> None:
    with pytest.raises(ConfigError, match="stray entry"):
        compute(_archive((_member("elsewhere"), b"x")), Manifest(entries={}), _snapshot())


def test_a_deletion_list_naming_git_is_refused() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        meta = json.dumps({"deleted": [".git/HEAD"], "other": []}).encode()
        info = tarfile.TarInfo("meta.json")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
    with pytest.raises(ConfigError, match=r"under \.git"):
        compute(buf.getvalue(), Manifest(entries={}), _snapshot())


def test_an_unchanged_entry_claimed_as_changed_is_dropped() -> None:
    entry = Entry(
        "file", 0o644, sha256="2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
        size=1,
    )  # fmt: skip
    cs = compute(_archive((_member("files/a"), b"x")), Manifest(entries={"a": entry}), _snapshot())
    assert cs.changes == () and cs.patch == b""


def _link(target: str) -> Entry:
    return Entry("symlink", 0, target=target)


def test_links_pointing_out() -> None:
    def out(path: str, target: str, **tree: Entry) -> bool:
        return (
            leaves(
                {**{k.replace("__", "/"): v for k, v in tree.items()}, path: _link(target)}, path
            )
            is not None
        )

    assert out("a", "/etc/passwd")
    assert out("a", "../x")
    assert out("d/a", "../../x")
    assert not out("d/a", "../x")
    assert not out("a", "b/c")
    # Through other links, resolved as the kernel does, not as text.
    assert out("x", "sub/up/../f", sub=Entry("dir", 0o755), sub__up=_link(".."))
    assert not out("x", "sub/../f", sub=Entry("dir", 0o755))
    assert out("x", "sub/../f", sub=_link("."))
    assert out("a", "b", b=_link("a"))  # a loop
    assert check_path("a/b") == "a/b"
