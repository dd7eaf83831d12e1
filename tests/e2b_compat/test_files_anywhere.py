"""E2B code reaches any path its sandbox user may, as a cell in the sandbox sees it; the
workspace is the home, ``/home/user``; symlinks and file metadata read as envd reports them."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import FileType, InvalidArgumentException, NotFoundException, SandboxException
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService


@pytest.fixture(scope="module")
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    # The unchecked profile: code reading /etc runs without asking (strict asks; see below).
    sandbox = Sandbox.create(
        template="unchecked",
        api_key=e2b_service.alice,
        api_url=e2b_service.url,
        sandbox_url=e2b_service.url,
    )
    yield sandbox
    sandbox.kill()


def _inside(sbx: Sandbox, path: str) -> str:
    """The file as code in the sandbox reads it."""
    ex = sbx.run_code(f"print(open({path!r}).read(), end='')")
    assert ex.error is None, ex.error
    return "".join(ex.logs.stdout)


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "/etc/hosts", "/proc/self/status", "/proc/version"]
)
def test_files_the_sandbox_can_read_are_read_as_it_sees_them(sbx: Sandbox, path: str) -> None:
    read = sbx.files.read(path)
    assert read
    if path == "/proc/self/status":
        # Another process reads it each time: its own status, from the sandbox's kernel.
        assert "NoNewPrivs:\t1" in read and "NoNewPrivs:\t1" in _inside(sbx, path)
    else:
        assert read == _inside(sbx, path)


def test_dot_dot_and_relative_paths_resolve_as_paths_do(sbx: Sandbox) -> None:
    assert sbx.files.read("/home/user/../../etc/passwd") == sbx.files.read("/etc/passwd")
    sbx.files.write("rel.txt", "relative to the home")
    assert sbx.files.read("/home/user/rel.txt") == "relative to the home"
    assert sbx.files.read("../user/rel.txt") == "relative to the home"


def test_writes_go_where_the_sandbox_can_write(sbx: Sandbox) -> None:
    info = sbx.files.write("/tmp/e2b/note.txt", "in tmp")
    assert info.path == "/tmp/e2b/note.txt"
    assert _inside(sbx, "/tmp/e2b/note.txt") == "in tmp"
    assert sbx.files.read("/tmp/e2b/note.txt") == "in tmp"
    assert sbx.files.exists("/tmp/e2b/note.txt")
    assert [e.path for e in sbx.files.list("/tmp/e2b")] == ["/tmp/e2b/note.txt"]
    assert sbx.files.get_info("/tmp/e2b").type == FileType.DIR
    sbx.files.rename("/tmp/e2b/note.txt", "/home/user/moved.txt")
    assert sbx.files.read("/home/user/moved.txt") == "in tmp"
    sbx.files.remove("/tmp/e2b")
    assert not sbx.files.exists("/tmp/e2b")
    with pytest.raises(NotFoundException):
        sbx.files.read("/tmp/e2b/note.txt")
    assert sbx.commands.run("pwd && ls", cwd="/tmp").stdout.startswith("/tmp\n")


def test_what_the_sandbox_may_not_write_is_refused_by_the_sandbox(sbx: Sandbox) -> None:
    before = _inside(sbx, "/etc/passwd")
    with pytest.raises(SandboxException, match="permission denied inside"):
        sbx.files.write("/etc/passwd", "planted")
    assert _inside(sbx, "/etc/passwd") == before
    with pytest.raises(SandboxException, match="permission denied inside"):
        sbx.files.remove("/etc/passwd")
    with pytest.raises(InvalidArgumentException, match="is a directory"):
        sbx.files.read("/etc")


def test_a_symlink_reads_as_its_target_and_leads_where_it_leads_inside(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/links/data.txt", "the target")
    ex = sbx.run_code(
        "import os\nos.symlink('data.txt', 'links/to-data')\n"
        "os.symlink('/etc', 'links/to-etc')\nos.symlink('/nowhere', 'links/dangling')"
    )
    assert ex.error is None, ex.error
    listed = {e.name: e for e in sbx.files.list("/home/user/links")}
    assert listed["to-data"].type == FileType.SYMLINK
    assert listed["to-data"].symlink_target == "/home/user/links/data.txt"
    assert listed["to-etc"].symlink_target == "/etc"
    assert listed["dangling"].symlink_target == "/nowhere"
    assert listed["data.txt"].symlink_target is None
    # A link is listed, not entered, however deep the listing.
    deep = [e.path for e in sbx.files.list("/home/user/links", depth=3)]
    assert not any(p.startswith("/home/user/links/to-etc/") for p in deep)
    # A workspace file is read as an export, which follows no link; its target is read.
    with pytest.raises(NotFoundException, match="follows no link"):
        sbx.files.read("/home/user/links/to-etc/passwd")
    assert sbx.files.read(listed["to-etc"].symlink_target + "/passwd") == _inside(
        sbx, "/etc/passwd"
    )


def test_the_wire_gives_the_targets_type_and_marks_the_link(
    e2b_service: E2BService, sbx: Sandbox
) -> None:
    sbx.files.write("/home/user/wire/f.txt", "f")
    assert sbx.run_code("import os\nos.symlink('f.txt', 'wire/l')").error is None
    reply = httpx.post(
        f"{e2b_service.url}/filesystem.Filesystem/ListDir",
        json={"path": "/home/user/wire"},
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sbx._envd_access_token or "",
            "Connect-Protocol-Version": "1",
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    entries = {e["name"]: e for e in reply.json()["entries"]}
    assert entries["l"]["type"] == "FILE_TYPE_FILE"
    assert entries["l"]["isSymlink"] is True
    assert entries["l"]["symlinkTarget"] == "/home/user/wire/f.txt"
    assert "isSymlink" not in entries["f.txt"]


def test_metadata_given_on_write_is_kept_and_listed(sbx: Sandbox) -> None:
    written = sbx.files.write("/home/user/meta.txt", "m", metadata={"Owner": "alice", "k": "v"})
    # Keys are lowercased, as envd does.
    assert written.metadata == {"owner": "alice", "k": "v"}
    assert sbx.files.get_info("/home/user/meta.txt").metadata == {"owner": "alice", "k": "v"}
    listed = {e.name: e for e in sbx.files.list("/home/user")}
    assert listed["meta.txt"].metadata == {"owner": "alice", "k": "v"}
    # They are the file's user.e2b.* extended attributes: code sees them, a rename keeps them.
    ex = sbx.run_code("import os\nos.getxattr('meta.txt', 'user.e2b.owner').decode()")
    assert ex.text == "'alice'"
    sbx.files.rename("/home/user/meta.txt", "/home/user/meta2.txt")
    assert sbx.files.get_info("/home/user/meta2.txt").metadata == {"owner": "alice", "k": "v"}
    sbx.files.write("/home/user/plain.txt", "p")
    assert sbx.files.get_info("/home/user/plain.txt").metadata is None


def test_the_profile_judges_a_file_operation_as_code_touching_its_path(
    e2b_service: E2BService,
) -> None:
    strict = Sandbox.create(
        api_key=e2b_service.alice, api_url=e2b_service.url, sandbox_url=e2b_service.url
    )
    try:
        # strict asks a person before code reads outside the workspace, inputs and /tmp: so
        # it does for a file read, as for run_code doing the same.
        ex = strict.run_code("print(open('/etc/passwd').read())")
        assert ex.error is not None and ex.error.name == "ApprovalRequired"
        with pytest.raises(SandboxException, match="needs approval"):
            strict.files.read("/etc/passwd")
        with pytest.raises(SandboxException, match="needs approval"):
            strict.files.write("/home/user/x.txt", "x") and strict.files.rename(
                "/home/user/x.txt", "/etc/x.txt"
            )
        strict.files.write("/tmp/ok.txt", "tmp is the sandbox's")
        assert strict.files.read("/tmp/ok.txt") == "tmp is the sandbox's"
        # A workspace file the profile does not let out is not let out by another path.
        strict.files.write("/home/user/job/script.py", "print(1)")
        ex = strict.run_code("import os\nos.symlink(os.path.abspath('job/script.py'), '/tmp/l')")
        assert ex.error is None, ex.error
        with pytest.raises(SandboxException, match="does not allow exporting"):
            strict.files.read("/tmp/l")
        strict.files.write("/home/user/ok.csv", "a,b\n")
        assert (
            strict.run_code("import os\nos.symlink(os.path.abspath('ok.csv'), '/tmp/c')").error
            is None
        )
        assert strict.files.read("/tmp/c") == "a,b\n"
    finally:
        strict.kill()


def test_code_commands_and_shell_escapes_start_in_the_home(e2b_service: E2BService) -> None:
    # The default profile (strict): the home is a path code may use without asking anyone.
    sandbox = Sandbox.create(
        api_key=e2b_service.alice, api_url=e2b_service.url, sandbox_url=e2b_service.url
    )
    try:
        ex = sandbox.run_code("import os\nprint(os.getcwd())")
        assert ex.error is None, ex.error
        assert ex.logs.stdout == ["/home/user\n"]
        assert sandbox.commands.run("pwd").stdout == "/home/user\n"
        ex = sandbox.run_code("!pwd")
        assert ex.error is None, ex.error
        assert "".join(ex.logs.stdout) == "/home/user\n"
        written = sandbox.run_code(
            "with open('/home/user/made.txt', 'w') as f:\n    f.write('by code')"
        )
        assert written.error is None, written.error
        assert sandbox.files.read("made.txt") == "by code"
        assert [e.path for e in sandbox.files.list("/home/user")] == ["/home/user/made.txt"]
    finally:
        sandbox.kill()
