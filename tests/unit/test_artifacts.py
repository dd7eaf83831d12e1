"""Export of files from a (hostile) workspace, and the content-addressed artifact store.

Every test builds a real directory tree in ``tmp_path``: the point is what the kernel does with
links, FIFOs, sockets and sparse files, which a mock would not tell.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from sandcell.artifacts import (
    ArtifactStore,
    ArtifactTooLarge,
    ExportLimits,
    collect_exports,
    validate_globs,
)
from sandcell.errors import ConfigError, InfraError
from sandcell.spec import Artifact, RejectedExport

GiB = 1024 * 1024 * 1024


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, standing for the host."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


def write(path: Path, data: bytes | str = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def export(
    ws: Path, globs: list[str], store: ArtifactStore, **limits: int
) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
    return collect_exports(ws, globs, store, ExportLimits(**limits))


def stored_files(store: ArtifactStore) -> list[Path]:
    """Every content file in the store (temporary files excluded)."""
    return sorted(p for p in store.root.rglob("*") if p.is_file() and ".incoming" not in p.parts)


def reasons(rejected: tuple[RejectedExport, ...]) -> dict[str, str]:
    return {r.path: r.reason for r in rejected}


# ---------------------------------------------------------------------------------------------
# validate_globs


def test_validate_globs_normalises() -> None:
    globs = ["./out/*.png", "result.json", "**/*.csv", "out/*.png", "a/./b"]
    assert validate_globs(globs) == ("out/*.png", "result.json", "**/*.csv", "a/b")
    assert validate_globs([]) == ()


@pytest.mark.parametrize(
    ("glob", "fragment"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../secret", "'..'"),
        ("out/../../x", "'..'"),
        ("out/..", "'..'"),
        ("a\x00b", "control"),
        ("a\nb", "control"),
        ("a\x1b[31m", "control"),
        ("a\u009bb", "control"),
        ("out\\x.png", "backslash"),
        ("out/", "'out/**'"),
        ("a//b", "empty component"),
        (".", "'**'"),
    ],
)
def test_validate_globs_refuses(glob: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="glob") as info:
        validate_globs([glob])
    assert fragment in str(info.value)


def test_validate_globs_refuses_a_bare_string() -> None:
    with pytest.raises(ConfigError, match="list of strings"):
        validate_globs("out/*.png")


def test_collect_exports_validates_globs(ws: Path, store: ArtifactStore) -> None:
    with pytest.raises(ConfigError, match=r"'\.\.'"):
        export(ws, ["../*"], store)


# ---------------------------------------------------------------------------------------------
# Matching


@pytest.fixture
def tree(ws: Path) -> Path:
    for rel in [
        "a.txt",
        "b.txt",
        "ab.txt",
        ".hidden.txt",
        "top.csv",
        "top.png",
        "out/x.png",
        "out/y.jpg",
        "out/sub/z.png",
        "deep/a/b/c.csv",
        "deep/a/b/d.txt",
        "result.json",
    ]:
        write(ws / rel, rel)
    return ws


@pytest.mark.parametrize(
    ("globs", "expected"),
    [
        (["out/*.png"], ["out/x.png"]),
        (["*.png"], ["top.png"]),  # '*' never crosses a '/'
        (["**/*.png"], ["out/sub/z.png", "out/x.png", "top.png"]),  # '**' may match zero dirs
        (["**/*.csv"], ["deep/a/b/c.csv", "top.csv"]),
        (["out/**"], ["out/sub/z.png", "out/x.png", "out/y.jpg"]),
        (["deep/**/d.txt"], ["deep/a/b/d.txt"]),
        (["deep/*/b/*"], ["deep/a/b/c.csv", "deep/a/b/d.txt"]),
        (["?.txt"], ["a.txt", "b.txt"]),
        (["[ab].txt"], ["a.txt", "b.txt"]),
        (["[!a].txt"], ["b.txt"]),
        (["*.txt"], [".hidden.txt", "a.txt", "ab.txt", "b.txt"]),  # like pathlib: dotfiles too
        (["result.json", "result.json", "nothing/*"], ["result.json"]),
        (["**"], None),  # everything
    ],
)
def test_glob_matching(
    tree: Path, store: ArtifactStore, globs: list[str], expected: list[str] | None
) -> None:
    artifacts, rejected = export(tree, globs, store)
    if expected is None:
        expected = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert sorted(a.path for a in artifacts) == expected
    assert rejected == ()
    for art in artifacts:
        # Each file holds its own path: the right content went under the right name.
        assert store.path_for(art.sha256).read_bytes() == art.path.encode()
        assert art.size == len(art.path)
        assert art.sha256 == hashlib.sha256(art.path.encode()).hexdigest()


def test_artifacts_come_in_sorted_order(tree: Path, store: ArtifactStore) -> None:
    artifacts, _ = export(tree, ["**"], store)
    paths = [tuple(a.path.split("/")) for a in artifacts]
    assert paths == sorted(paths)


def test_media_types(ws: Path, store: ArtifactStore) -> None:
    for name in ["p.png", "r.json", "t.csv", "blob.weird-ext", "noext", "a.tar.gz", "data:,x"]:
        write(ws / name)
    artifacts, _ = export(ws, ["*"], store)
    types = {a.path: a.media_type for a in artifacts}
    assert types["p.png"] == "image/png"
    assert types["r.json"] == "application/json"
    assert types["t.csv"] == "text/csv"
    assert types["blob.weird-ext"] == "application/octet-stream"
    assert types["noext"] == "application/octet-stream"
    assert types["a.tar.gz"] == "application/gzip"
    # A name that looks like a data URL does not choose its own media type.
    assert types["data:,x"] == "application/octet-stream"


def test_a_directory_named_by_a_glob_is_rejected_with_a_hint(
    ws: Path, store: ArtifactStore
) -> None:
    write(ws / "out/x.png")
    artifacts, rejected = export(ws, ["out"], store)
    assert artifacts == ()
    assert "directory" in reasons(rejected)["out"]
    assert "'out/**'" in reasons(rejected)["out"]
    # 'out/**' asks for the files under it, not the directory: no rejection for it.
    artifacts, rejected = export(ws, ["out/**"], store)
    assert [a.path for a in artifacts] == ["out/x.png"]
    assert rejected == ()


def test_no_globs_means_nothing_is_looked_at(tmp_path: Path, store: ArtifactStore) -> None:
    assert export(tmp_path / "does-not-exist", [], store) == ((), ())


def test_missing_workspace_is_an_infra_error(tmp_path: Path, store: ArtifactStore) -> None:
    with pytest.raises(InfraError, match="cannot be opened"):
        export(tmp_path / "does-not-exist", ["*"], store)


# ---------------------------------------------------------------------------------------------
# Hostile workspaces: links


def test_symlink_to_host_file_is_rejected(ws: Path, store: ArtifactStore) -> None:
    passwd = Path("/etc/passwd").read_bytes()
    (ws / "out.txt").symlink_to("/etc/passwd")
    write(ws / "real.txt", b"fine")
    artifacts, rejected = export(ws, ["*.txt", "out.txt"], store)
    assert [a.path for a in artifacts] == ["real.txt"]
    assert "symbolic link" in reasons(rejected)["out.txt"]
    for path in stored_files(store):
        data = path.read_bytes()
        assert data == b"fine"
        assert passwd not in data


def test_symlinked_directory_is_not_followed(ws: Path, store: ArtifactStore, outside: Path) -> None:
    write(outside / "secret.txt", b"host secret")
    (ws / "out").symlink_to(outside, target_is_directory=True)
    (ws / "venv").symlink_to(outside, target_is_directory=True)
    artifacts, rejected = export(ws, ["out/*.txt", "**/*.txt", "**/secret.txt"], store)
    assert artifacts == ()
    # The glob names 'out' specifically: the caller is told why nothing came through it.
    assert "not followed" in reasons(rejected)["out"]
    # 'venv' is only passed over by '**': not worth a rejection.
    assert "venv" not in reasons(rejected)
    assert stored_files(store) == []


def test_symlinked_directory_matching_a_glob_is_rejected(
    ws: Path, store: ArtifactStore, outside: Path
) -> None:
    write(outside / "secret.txt", b"host secret")
    (ws / "data.csv").symlink_to(outside, target_is_directory=True)
    artifacts, rejected = export(ws, ["*.csv", "**"], store)
    assert artifacts == ()
    assert "symbolic link" in reasons(rejected)["data.csv"]
    assert stored_files(store) == []


def test_dangling_and_looping_symlinks(ws: Path, store: ArtifactStore) -> None:
    (ws / "dangling.txt").symlink_to("/nonexistent/file")
    (ws / "loop.txt").symlink_to("loop.txt")
    artifacts, rejected = export(ws, ["*.txt"], store)
    assert artifacts == ()
    assert set(reasons(rejected)) == {"dangling.txt", "loop.txt"}
    assert all("symbolic link" in r.reason for r in rejected)


def test_hard_link_to_outside_file_is_rejected(
    ws: Path, store: ArtifactStore, outside: Path
) -> None:
    secret = write(outside / "secret.txt", b"host secret")
    os.link(secret, ws / "linked.txt")
    artifacts, rejected = export(ws, ["*.txt"], store)
    assert artifacts == ()
    assert "hard link" in reasons(rejected)["linked.txt"]
    assert stored_files(store) == []


# ---------------------------------------------------------------------------------------------
# Hostile workspaces: special files


def run_with_deadline(
    ws: Path, globs: list[str], store: ArtifactStore, seconds: float = 10.0
) -> tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]:
    """collect_exports in a thread, failing (rather than hanging) if it blocks."""
    result: list[tuple[tuple[Artifact, ...], tuple[RejectedExport, ...]]] = []
    thread = threading.Thread(target=lambda: result.append(export(ws, globs, store)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "collect_exports blocked"
    assert result, "collect_exports raised"
    return result[0]


def test_fifo_is_rejected_without_blocking(ws: Path, store: ArtifactStore) -> None:
    os.mkfifo(ws / "pipe.txt")
    write(ws / "z.txt", b"after the fifo")
    artifacts, rejected = run_with_deadline(ws, ["*.txt"], store)
    assert [a.path for a in artifacts] == ["z.txt"]
    assert "FIFO" in reasons(rejected)["pipe.txt"]


def test_unix_socket_is_rejected(
    ws: Path, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bind by a relative name: tmp_path may be longer than a socket address allows.
    monkeypatch.chdir(ws)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("s.sock")
        sock.listen(1)
        artifacts, rejected = run_with_deadline(ws, ["*.sock"], store)
    assert artifacts == ()
    assert "socket" in reasons(rejected)["s.sock"]


def test_device_node_is_rejected(ws: Path, store: ArtifactStore) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a device node")
    try:
        # The same device as /dev/zero: if it were ever read, the export would never end.
        os.mknod(ws / "zero.bin", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("this root cannot create device nodes here (no CAP_MKNOD)")
    artifacts, rejected = run_with_deadline(ws, ["*.bin"], store)
    assert artifacts == ()
    assert "character device" in reasons(rejected)["zero.bin"]


# ---------------------------------------------------------------------------------------------
# Hostile workspaces: modes, sizes, names


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6777, 0o700, 0o000])
def test_no_permission_bit_is_carried_over(ws: Path, store: ArtifactStore, mode: int) -> None:
    path = write(ws / "tool", b"#!/bin/sh\necho hi\n")
    path.chmod(mode)
    artifacts, rejected = export(ws, ["tool"], store)
    if mode == 0o000 and os.geteuid() != 0:
        # Not readable by us: refused, not an error.
        assert "could not be opened" in reasons(rejected)["tool"]
        return
    assert rejected == ()
    (art,) = artifacts
    assert stat.S_IMODE(store.path_for(art.sha256).stat().st_mode) == 0o644


def test_huge_sparse_file_is_rejected_without_reading(ws: Path, store: ArtifactStore) -> None:
    with open(ws / "huge.bin", "wb") as f:
        f.truncate(10 * GiB)
    start = time.monotonic()
    artifacts, rejected = export(ws, ["*.bin"], store)
    assert time.monotonic() - start < 2.0
    assert artifacts == ()
    reason = reasons(rejected)["huge.bin"]
    assert "per-file cap" in reason
    assert str(10 * GiB) in reason
    assert stored_files(store) == []


def test_file_size_cap_boundary(ws: Path, store: ArtifactStore) -> None:
    write(ws / "exact.bin", b"a" * 1000)
    write(ws / "over.bin", b"b" * 1001)
    artifacts, rejected = export(ws, ["*.bin"], store, max_file_bytes=1000)
    assert [(a.path, a.size) for a in artifacts] == [("exact.bin", 1000)]
    assert "max_file_bytes" in reasons(rejected)["over.bin"]


@pytest.mark.parametrize(
    ("raw_name", "shown", "fragment"),
    [
        (b"new\nline.txt", "new\\x0aline.txt", "control character"),
        (b"esc\x1b[31mred.txt", "esc\\x1b[31mred.txt", "control character"),
        (b"del\x7f.txt", "del\\x7f.txt", "control character"),
        (b"csi\xc2\x9b2J.txt", "csi\\x9b2J.txt", "control character"),  # C1 CSI, valid UTF-8
        (b"bad\xff\xfe.txt", "bad\\xff\\xfe.txt", "not valid UTF-8"),
        (b"surrogate\xed\xa0\x80.txt", "surrogate\\xed\\xa0\\x80.txt", "not valid UTF-8"),
    ],
)
def test_hostile_names_are_rejected_and_shown_escaped(
    ws: Path, store: ArtifactStore, raw_name: bytes, shown: str, fragment: str
) -> None:
    with open(os.fsencode(ws) + b"/" + raw_name, "wb") as f:
        f.write(b"payload")
    write(ws / "fine.txt", b"fine")
    artifacts, rejected = export(ws, ["*.txt"], store)
    assert [a.path for a in artifacts] == ["fine.txt"]
    (rej,) = rejected
    assert rej.path == shown
    assert fragment in rej.reason
    # Nothing a terminal would interpret ends up in the report.
    for text in (rej.path, rej.reason):
        assert all(ch.isprintable() for ch in text)
        text.encode("utf-8")  # strict: no lone surrogates


def test_file_under_a_badly_named_directory_is_rejected(ws: Path, store: ArtifactStore) -> None:
    bad_dir = os.fsencode(ws) + b"/dir\xff"
    os.mkdir(bad_dir)
    with open(bad_dir + b"/x.csv", "wb") as f:
        f.write(b"1,2\n")
    artifacts, rejected = export(ws, ["**/*.csv"], store)
    assert artifacts == ()
    assert "not valid UTF-8" in reasons(rejected)["dir\\xff/x.csv"]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("-rf", "starts with '-'"),
        ("--help", "starts with '-'"),
        ("-", "starts with '-'"),
        (" leading.txt", "leading or trailing whitespace"),
        ("trailing.txt ", "leading or trailing whitespace"),
        ("\u00a0nbsp.txt", "leading or trailing whitespace"),
        ("ideographic\u3000", "leading or trailing whitespace"),
        ("...", "only of dots"),
        ("....", "only of dots"),
    ],
)
def test_names_a_shell_misreads_are_rejected(
    ws: Path, store: ArtifactStore, name: str, fragment: str
) -> None:
    write(ws / name, b"payload")
    write(ws / "fine.txt", b"fine")
    artifacts, rejected = export(ws, ["*"], store)
    assert [a.path for a in artifacts] == ["fine.txt"]
    (rej,) = rejected
    assert rej.path == name
    assert fragment in rej.reason and "not exported" in rej.reason, rej.reason


@pytest.mark.parametrize("directory", ["-d", " d", "d ", "..."])
def test_file_under_a_directory_a_shell_misreads_is_rejected(
    ws: Path, store: ArtifactStore, directory: str
) -> None:
    write(ws / directory / "x.csv", b"1,2\n")
    artifacts, rejected = export(ws, ["**/*.csv"], store)
    assert artifacts == ()
    assert f"name component {directory!r}" in reasons(rejected)[f"{directory}/x.csv"]


@pytest.mark.parametrize("name", ["a-b.txt", "x-", "in side.txt", ".hidden", "..a", "a..", "a.b"])
def test_names_that_only_contain_a_dash_space_or_dots_are_exported(
    ws: Path, store: ArtifactStore, name: str
) -> None:
    write(ws / name, b"payload")
    artifacts, rejected = export(ws, ["*"], store)
    assert rejected == ()
    assert [a.path for a in artifacts] == [name]


def test_dotdot_cannot_be_a_name_and_cannot_be_asked_for(ws: Path) -> None:
    # The kernel never lists '.' or '..' as entries; the only way to ask for them is a glob.
    assert sorted(os.listdir(ws)) == []
    with pytest.raises(ConfigError):
        validate_globs(["out/../../etc/passwd"])


# ---------------------------------------------------------------------------------------------
# Caps and bounds


def test_file_count_cap(ws: Path, store: ArtifactStore) -> None:
    for i in range(5000):
        write(ws / f"f{i:05d}.txt", f"content {i}")
    artifacts, rejected = export(ws, ["*.txt"], store, max_files=100)
    assert [a.path for a in artifacts] == [f"f{i:05d}.txt" for i in range(100)]
    assert len(rejected) == 4900
    assert {r.path for r in rejected} == {f"f{i:05d}.txt" for i in range(100, 5000)}
    assert all("max_files" in r.reason for r in rejected)
    assert len(stored_files(store)) == 100


def test_rejected_files_do_not_count_against_the_file_cap(ws: Path, store: ArtifactStore) -> None:
    os.mkfifo(ws / "a.txt")
    write(ws / "b.txt", b"b")
    write(ws / "c.txt", b"c")
    artifacts, rejected = export(ws, ["*.txt"], store, max_files=2)
    assert [a.path for a in artifacts] == ["b.txt", "c.txt"]
    assert list(reasons(rejected)) == ["a.txt"]


def test_total_size_cap(ws: Path, store: ArtifactStore) -> None:
    write(ws / "a.bin", b"a" * 600)
    write(ws / "b.bin", b"b" * 600)  # would go past the cap
    write(ws / "c.bin", b"c" * 400)  # still fits after a: the cap is applied file by file
    write(ws / "d.bin", b"d" * 1)  # the cap is reached
    artifacts, rejected = export(ws, ["*.bin"], store, max_total_bytes=1000)
    assert [a.path for a in artifacts] == ["a.bin", "c.bin"]
    assert sum(a.size for a in artifacts) == 1000
    assert set(reasons(rejected)) == {"b.bin", "d.bin"}
    assert all("max_total_bytes" in r.reason for r in rejected)


def test_walk_is_bounded(ws: Path, store: ArtifactStore) -> None:
    for i in range(300):
        write(ws / f"f{i:03d}", b"x")
    artifacts, rejected = export(ws, ["nothing-matches-*"], store, max_walk_entries=100)
    assert artifacts == ()
    (rej,) = rejected
    assert rej.path == "."
    assert "max_walk_entries" in rej.reason


def test_depth_is_bounded(ws: Path, store: ArtifactStore) -> None:
    write(ws / "a/b/ok.txt")
    write(ws / "a/b/c/d/e/f/too-deep.txt")
    artifacts, rejected = export(ws, ["**/*.txt"], store, max_depth=3)
    assert [a.path for a in artifacts] == ["a/b/ok.txt"]
    assert "deeper than 3" in reasons(rejected)["a/b/c/d"]


def test_export_limits_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_files"):
        ExportLimits(max_files=0)
    with pytest.raises(ConfigError, match="max_total_bytes"):
        ExportLimits(max_total_bytes=True)


# ---------------------------------------------------------------------------------------------
# The store


def test_identical_content_is_stored_once(ws: Path, store: ArtifactStore) -> None:
    write(ws / "one.txt", b"same bytes")
    write(ws / "two/other.txt", b"same bytes")
    artifacts, _ = export(ws, ["**/*.txt"], store)
    assert len(artifacts) == 2
    assert artifacts[0].sha256 == artifacts[1].sha256
    assert stored_files(store) == [store.path_for(artifacts[0].sha256)]
    assert list((store.root / ".incoming").iterdir()) == []


def test_store_layout_and_has(ws: Path, store: ArtifactStore) -> None:
    data = b"layout"
    sha = hashlib.sha256(data).hexdigest()
    assert not store.has(sha)
    fd = os.open(write(ws / "f", data), os.O_RDONLY)
    try:
        assert store.put_fd(fd, 100) == (sha, len(data))
    finally:
        os.close(fd)
    assert store.path_for(sha) == store.root / sha[:2] / sha[2:]
    assert store.path_for(sha).read_bytes() == data
    assert store.has(sha)


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "g" * 64, "../" + "a" * 61, "a" * 65])
def test_path_for_refuses_what_is_not_a_digest(store: ArtifactStore, bad: str) -> None:
    with pytest.raises(ConfigError, match="SHA-256"):
        store.path_for(bad)


def test_put_fd_stops_at_the_cap_whatever_the_source_claims(store: ArtifactStore) -> None:
    # A pipe has no size to check beforehand: only the read itself can stop.
    r, w = os.pipe()
    try:
        os.write(w, b"y" * 20)
        os.close(w)
        with pytest.raises(ArtifactTooLarge):
            store.put_fd(r, 10)
    finally:
        os.close(r)
    assert stored_files(store) == []
    assert list((store.root / ".incoming").iterdir()) == []


# ---------------------------------------------------------------------------------------------
# copy_out


def stored_artifacts(ws: Path, store: ArtifactStore, files: dict[str, bytes]) -> list[Artifact]:
    for rel, data in files.items():
        write(ws / rel, data)
    artifacts, rejected = export(ws, ["**"], store)
    assert rejected == ()
    return list(artifacts)


def test_copy_out_writes_files(tmp_path: Path, ws: Path, store: ArtifactStore) -> None:
    files = {"result.json": b"{}", "out/plot.png": b"\x89PNG", "out/sub/data.csv": b"1,2"}
    artifacts = stored_artifacts(ws, store, files)
    dest = tmp_path / "dest"
    written = store.copy_out(artifacts, dest)
    assert written == [dest / a.path for a in artifacts]
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
        assert stat.S_IMODE((dest / rel).stat().st_mode) == 0o644
    # Again into the same place: files are replaced, nothing left over.
    store.copy_out(artifacts, dest)
    assert sorted(p.name for p in dest.rglob("*")) == sorted(
        ["result.json", "out", "plot.png", "sub", "data.csv"]
    )


def test_copy_out_refuses_a_symlinked_directory_in_dest(
    tmp_path: Path, ws: Path, store: ArtifactStore, outside: Path
) -> None:
    artifacts = stored_artifacts(ws, store, {"out/plot.png": b"png"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match="symbolic link"):
        store.copy_out(artifacts, dest)
    assert list(outside.iterdir()) == []


def test_copy_out_refuses_a_symlink_as_the_file(
    tmp_path: Path, ws: Path, store: ArtifactStore, outside: Path
) -> None:
    artifacts = stored_artifacts(ws, store, {"plot.png": b"png"})
    target = write(outside / "victim", b"untouched")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "plot.png").symlink_to(target)
    with pytest.raises(ConfigError, match="not a regular file"):
        store.copy_out(artifacts, dest)
    assert target.read_bytes() == b"untouched"


def test_copy_out_never_writes_into_a_hard_link(
    tmp_path: Path, ws: Path, store: ArtifactStore, outside: Path
) -> None:
    artifacts = stored_artifacts(ws, store, {"plot.png": b"new content"})
    target = write(outside / "victim", b"untouched")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.link(target, dest / "plot.png")
    store.copy_out(artifacts, dest)
    assert (dest / "plot.png").read_bytes() == b"new content"
    assert target.read_bytes() == b"untouched"


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a//b", "a/./b", "a/../b", "x\ny"])
def test_copy_out_refuses_paths_leaving_dest(
    tmp_path: Path, ws: Path, store: ArtifactStore, path: str
) -> None:
    (real,) = stored_artifacts(ws, store, {"f": b"data"})
    forged = Artifact(path=path, sha256=real.sha256, size=real.size, media_type=real.media_type)
    dest = tmp_path / "dest"
    with pytest.raises(ConfigError, match="artifact path"):
        store.copy_out([forged], dest)
    assert not (tmp_path / "escape").exists()


def test_copy_out_refuses_content_missing_from_the_store(
    tmp_path: Path, store: ArtifactStore
) -> None:
    ghost = Artifact(path="x", sha256="0" * 64, size=1, media_type="text/plain")
    with pytest.raises(ConfigError, match="not in the store"):
        store.copy_out([ghost], tmp_path / "dest")
