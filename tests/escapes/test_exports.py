"""Escapes through the export of files: the workspace is prepared by hostile code, then sandcell
copies the requested files out. Only regular files leave, as plain bytes, within the caps; links,
FIFOs, devices, sockets, hostile names and oversized files are rejected with a reason.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.conftest import wasm_cannot

if TYPE_CHECKING:
    from .conftest import Attack

PREPARED = "PREPARED"


def _artifacts(res: dict[str, Any]) -> list[dict[str, Any]]:
    return list(res["artifacts"])


def _rejected(res: dict[str, Any]) -> dict[str, str]:
    return {str(r["path"]): str(r["reason"]) for r in res["rejected_exports"]}


def _stored(attack: Attack, sha: str) -> Path:
    return attack.home / "artifacts" / sha[:2] / sha[2:]


def _exported_contents(attack: Attack, res: dict[str, object]) -> list[bytes]:
    return [_stored(attack, str(a["sha256"])).read_bytes() for a in _artifacts(res)]


def _prepared(attack: Attack, res: dict[str, object]) -> str:
    out = str(res["stdout"])
    if os.environ.get("SANDCELL_ESCAPE_SHOW"):
        print(f"\n[{attack.identity}] {out}artifacts={res['artifacts']}")
        print(f"rejected={res['rejected_exports'][:6]}")  # type: ignore[index]
    assert res["outcome"] == "ok", f"[{attack.identity}] {res['reason']}: {res['stderr']}"
    assert PREPARED in out, f"[{attack.identity}] the workspace was not prepared: {res}"
    assert "BREACH" not in out, f"[{attack.identity}] ESCAPE: {out}"
    return out


def test_blocks_export_of_symlink_to_etc_passwd(attack: Attack) -> None:
    wasm_cannot(attack.sandbox, "links")
    body = f"""
    os.mkdir("out")
    os.symlink("/etc/passwd", "out/passwd.txt")
    os.symlink("/etc", "out/etc")
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*", "out/etc/*"])
    _prepared(attack, res)
    assert _artifacts(res) == [], f"[{attack.identity}] ESCAPE: {res['artifacts']}"
    rejected = _rejected(res)
    assert "symbolic link" in rejected.get("out/passwd.txt", ""), rejected


def test_blocks_export_of_symlink_to_host_file(attack: Attack, tmp_path: Path) -> None:
    """Links to host paths (a file, a directory) that exist on the host but not in the sandbox:
    the exporter, working on the host, must not follow them."""
    wasm_cannot(attack.sandbox, "links")
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret: BREACH\n")
    secret.chmod(0o644)
    body = f"""
    os.mkdir("out")
    os.symlink({str(secret)!r}, "out/report.txt")
    os.symlink({str(tmp_path)!r}, "hostdir")
    os.symlink("/", "rootdir")
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*", "hostdir/*", "rootdir/etc/*", "**/*.txt"])
    _prepared(attack, res)
    contents = _exported_contents(attack, res)
    assert not any(b"host secret" in c for c in contents), f"[{attack.identity}] ESCAPE"
    assert _artifacts(res) == [], res["artifacts"]
    assert "symbolic link" in _rejected(res).get("out/report.txt", ""), res["rejected_exports"]


def test_blocks_export_of_hard_link(attack: Attack) -> None:
    """A hard link into the workspace from /tmp fails (another filesystem); two names for one file
    inside the workspace are both refused (a link count above one may mean a host file)."""
    wasm_cannot(attack.sandbox, "links")
    body = f"""
    with open("/tmp/elsewhere.txt", "w") as f:
        f.write("from /tmp")
    os.mkdir("out")
    attempt("hard link /tmp -> workspace",
            lambda: os.link("/tmp/elsewhere.txt", "out/linked.txt") or "linked",
            ok=(errno.EXDEV,))
    attempt("hard link /usr -> workspace",
            lambda: os.link("/usr/bin/env", "out/env") or "linked",
            ok=(errno.EXDEV, errno.EPERM, errno.EACCES))
    with open("out/a.txt", "w") as f:
        f.write("twice")
    os.link("out/a.txt", "out/b.txt")
    print("nlink", os.stat("out/a.txt").st_nlink)
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"])
    out = _prepared(attack, res)
    assert out.count("blocked:") == 2 and "UNEXPECTED" not in out, out
    assert "nlink 2" in out, out
    assert _artifacts(res) == [], f"[{attack.identity}] a hard-linked file was exported"
    rejected = _rejected(res)
    for name in ("out/a.txt", "out/b.txt"):
        assert "hard link" in rejected.get(name, ""), rejected


def test_blocks_export_of_fifo(attack: Attack) -> None:
    """A FIFO with no writer would block a naive reader forever; the run must end and the FIFO be
    refused."""
    wasm_cannot(attack.sandbox, "special_files")
    body = f"""
    os.mkdir("out")
    os.mkfifo("out/results.csv")
    print("made a fifo:", stat.S_ISFIFO(os.stat("out/results.csv").st_mode))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"], wall_time_s=20)
    out = _prepared(attack, res)
    assert _artifacts(res) == [], f"[{attack.identity}] ESCAPE: a FIFO was exported"
    rejected = _rejected(res)
    if attack.sandbox.backend == "gvisor" and "out/results.csv" not in rejected:
        # gVisor keeps a FIFO in its own file system: the gofer never creates it in the host
        # workspace, so the exporter finds nothing to refuse. The attack did make it inside.
        assert "made a fifo: True" in out, out
    else:
        assert "named pipe" in rejected.get("out/results.csv", ""), res["rejected_exports"]


def test_blocks_export_of_socket_file(attack: Attack) -> None:
    wasm_cannot(attack.sandbox, "special_files")
    body = f"""
    os.mkdir("out")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("out/data.sock")
    s.listen(1)
    print("made a socket file:", stat.S_ISSOCK(os.stat("out/data.sock").st_mode))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"])
    out = _prepared(attack, res)
    assert _artifacts(res) == [], f"[{attack.identity}] ESCAPE: a socket file was exported"
    rejected = _rejected(res)
    if attack.sandbox.backend == "gvisor" and "out/data.sock" not in rejected:
        # As with FIFOs: a bound socket's file exists only in gVisor's own file system, never in
        # the host workspace. The attack did bind it inside.
        assert "made a socket file: True" in out, out
    else:
        assert "socket" in rejected.get("out/data.sock", ""), res["rejected_exports"]


def test_blocks_export_of_device_node(attack: Attack) -> None:
    wasm_cannot(attack.sandbox, "special_files")
    body = f"""
    os.mkdir("out")
    nodes = (("null", stat.S_IFCHR, 1, 3), ("mem", stat.S_IFCHR, 1, 1), ("sda", stat.S_IFBLK, 8, 0))
    for name, kind, major, minor in nodes:
        def mknod():
            os.mknod(f"out/{{name}}", kind | 0o666, os.makedev(major, minor))
            return "created"
        attempt(f"mknod out/{{name}}", mknod, ok=(errno.EPERM, errno.EACCES))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"])
    out = _prepared(attack, res)
    assert out.count("blocked:") == 3 and "UNEXPECTED" not in out, out
    assert _artifacts(res) == [], f"[{attack.identity}] ESCAPE: a device node was exported"


def test_blocks_setuid_bit_on_export(attack: Attack) -> None:
    """A setuid (setgid, sticky, executable) file is exported as bytes: the stored copy is 0644."""
    body = f"""
    os.mkdir("out")
    with open("out/tool", "w") as f:
        f.write("#!/bin/sh\\nid\\n")
    os.chmod("out/tool", 0o7755)
    print("mode", oct(stat.S_IMODE(os.stat("out/tool").st_mode)))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"])
    _prepared(attack, res)
    arts = _artifacts(res)
    assert [a["path"] for a in arts] == ["out/tool"], res
    stored = _stored(attack, str(arts[0]["sha256"]))
    mode = stat.S_IMODE(stored.stat().st_mode)
    assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0, oct(mode)
    assert mode & 0o111 == 0, oct(mode)
    assert mode == 0o644, oct(mode)
    assert stored.read_bytes() == b"#!/bin/sh\nid\n"


def test_blocks_export_of_huge_sparse_file(attack: Attack) -> None:
    """A 10 GiB sparse file (allowed by a raised file-size limit) is refused from its size, never
    read; the run and the export finish."""
    wasm_cannot(attack.sandbox, "big_files")
    body = f"""
    os.mkdir("out")
    try:
        with open("out/huge.bin", "wb") as f:
            f.truncate(10 << 30)
        print("size", os.stat("out/huge.bin").st_size)
    except OSError as exc:
        blocked("make a 10 GiB sparse file", errname(exc))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"], max_file_mb=16384)
    out = _prepared(attack, res)
    assert _artifacts(res) == [], f"[{attack.identity}] a 10 GiB file was exported"
    if "blocked:" not in out:
        reason = _rejected(res).get("out/huge.bin", "")
        assert "over the per-file cap" in reason, res["rejected_exports"]


def test_blocks_hostile_export_names(attack: Attack) -> None:
    """Names with a newline, an escape sequence or invalid UTF-8 are refused and shown escaped."""
    # On the wasm rung a name that is not UTF-8 never reaches the host: Emscripten decodes every
    # path as UTF-8 (0xff and what follows become U+FFFD), so the host file has a valid name.
    wasm = attack.sandbox.backend == "wasm"
    body = f"""
    os.mkdir("out")
    for raw in (b"out/evil\\nname.txt", b"out/\\x1b[31mred\\x1b[0m.txt", b"out/bad\\xff.txt",
                b"out/\\xc2\\x9bcsi.txt", b"out/plain.txt"):
        if {wasm!r} and raw == b"out/bad\\xff.txt":
            continue
        fd = os.open(raw, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, raw)
        os.close(fd)
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/*"])
    _prepared(attack, res)
    arts = _artifacts(res)
    assert [a["path"] for a in arts] == ["out/plain.txt"], arts
    rejected = _rejected(res)
    assert len(rejected) == (3 if wasm else 4), rejected
    for path, reason in rejected.items():
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in path), repr(path)
        assert "\udcff" not in path and "\ufffd" not in path, repr(path)
        assert "control character" in reason or "UTF-8" in reason, (path, reason)
    assert wasm or "out/bad\\xff.txt" in rejected, rejected
    assert "out/evil\\x0aname.txt" in rejected, rejected


def _misread_names(attack: Attack, paths: list[str], fragment: str) -> None:
    """The program writes ``paths`` (and a plain file); each is refused with ``fragment`` in the
    reason, and only the plain file leaves. A shell in the export directory running ``rm *``
    would otherwise have been handed these names as options or as other names."""
    body = f"""
    for path in {paths!r} + ["out/plain.txt"]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(path)
    print(sorted(os.listdir("out")))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/**"])
    out = _prepared(attack, res)
    # The names really were created in the workspace before the export looked at them.
    for path in paths:
        assert repr(path.split("/")[1]) in out, out
    assert [a["path"] for a in _artifacts(res)] == ["out/plain.txt"], res["artifacts"]
    rejected = _rejected(res)
    assert sorted(rejected) == sorted(paths), rejected
    for path, reason in rejected.items():
        assert fragment in reason and "not exported" in reason, (path, reason)


def test_blocks_export_names_that_read_as_options(attack: Attack) -> None:
    _misread_names(attack, ["out/-rf", "out/--help", "out/-x/inner.txt"], "starts with '-'")


def test_blocks_export_names_with_surrounding_whitespace(attack: Attack) -> None:
    paths = ["out/ lead.txt", "out/trail.txt ", "out/\u00a0nbsp.txt", "out/dir /inner.txt"]
    _misread_names(attack, paths, "leading or trailing whitespace")


def test_blocks_export_names_made_only_of_dots(attack: Attack) -> None:
    _misread_names(attack, ["out/...", "out/.....", "out/..../inner.txt"], "only of dots")


def test_blocks_export_of_thousands_of_files(attack: Attack) -> None:
    body = f"""
    os.mkdir("many")
    for i in range(3000):
        with open(f"many/f{{i:04d}}.txt", "w") as f:
            f.write(str(i))
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["many/*"])
    _prepared(attack, res)
    arts = _artifacts(res)
    rejected = _rejected(res)
    assert len(arts) == 100, len(arts)
    assert len(rejected) == 2900, len(rejected)
    assert all("max_files" in r for r in rejected.values())
    assert [a["path"] for a in arts] == [f"many/f{i:04d}.txt" for i in range(100)]


def test_blocks_export_escaping_workspace_by_directory_swap(attack: Attack) -> None:
    """A directory named by the globs is really a link to the host's root (then to /etc): the walk
    must not descend into it."""
    wasm_cannot(attack.sandbox, "links")
    body = f"""
    os.symlink("/", "out")
    os.symlink("/etc", "reports")
    print({PREPARED!r})
    """
    res = attack.run(body, exports=["out/etc/passwd", "out/**", "reports/*"])
    _prepared(attack, res)
    assert _artifacts(res) == [], f"[{attack.identity}] ESCAPE: {res['artifacts']}"
    assert os.path.exists("/etc/passwd")  # the host file the globs were after
