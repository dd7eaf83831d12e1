"""The official ``e2b_code_interpreter`` SDK (sync), unchanged, against ``sandcell serve``."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import (
    CommandExitException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b_code_interpreter import Sandbox
from packaging.version import Version
from tests.e2b_compat.conftest import E2BService

from sandcell.policy.approvals import ApprovalStore
from sandcell.service.tenants import TenantStore

PNG = b"\x89PNG\r\n\x1a\n"


def connection(service: E2BService, key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": service.url, "sandbox_url": service.url}


@pytest.fixture(scope="module")
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(
        envs={"GREETING": "hello"}, **connection(e2b_service, e2b_service.alice)
    )
    yield sandbox
    sandbox.kill()


# -- run_code ---------------------------------------------------------------------------------


def test_run_code_gives_the_last_value_stdout_and_callbacks(sbx: Sandbox) -> None:
    seen: list[str] = []
    results: list[Any] = []
    ex = sbx.run_code(
        "import os\nprint('hi', os.environ['GREETING'])\nx = 6 * 7\nx",
        on_stdout=lambda m: seen.append(m.line),
        on_result=results.append,
    )
    assert ex.error is None
    assert ex.text == "42"
    assert ex.logs.stdout == ["hi hello\n"]
    assert seen == ["hi hello\n"]
    assert [r.text for r in results] == ["42"]
    assert ex.execution_count is not None and ex.execution_count > 0
    # State persists: the next cell sees x.
    assert sbx.run_code("x + 1").text == "43"


def test_run_code_stderr_and_per_call_envs(sbx: Sandbox) -> None:
    errs: list[str] = []
    ex = sbx.run_code(
        "import os, sys\nprint(os.environ['ONLY_HERE'], file=sys.stderr)",
        envs={"ONLY_HERE": "scoped"},
        on_stderr=lambda m: errs.append(m.line),
    )
    assert ex.error is None
    assert ex.logs.stderr == ["scoped\n"]
    assert errs == ["scoped\n"]
    # The per-call variable does not outlive its call.
    after = sbx.run_code("import os\nos.environ.get('ONLY_HERE', 'gone')")
    assert after.text == "'gone'"


def test_run_code_error_has_name_value_traceback(sbx: Sandbox) -> None:
    errors: list[Any] = []
    ex = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "Traceback" in ex.error.traceback and "1 / 0" in ex.error.traceback
    assert errors and errors[0].name == "ZeroDivisionError"
    # The report is the error, not output, as a notebook shows it.
    assert not any("Traceback" in line for line in ex.logs.stderr)
    printed = sbx.run_code(
        "import sys, traceback\ntry:\n    {}['k']\nexcept KeyError:\n    traceback.print_exc()\n"
        "raise RuntimeError('after')"
    )
    assert printed.error is not None and printed.error.name == "RuntimeError"
    assert "KeyError" in "".join(printed.logs.stderr)
    assert "RuntimeError" not in "".join(printed.logs.stderr)
    syntax = sbx.run_code("1 +")
    assert syntax.error is not None and syntax.error.name == "SyntaxError"


def test_run_code_rich_outputs(sbx: Sandbox) -> None:
    table = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert table.error is None
    main = next(r for r in table.results if r.is_main_result)
    assert main.html is not None and "<table" in main.html
    assert main.text is not None and "a" in main.text
    # The table's JSON form (pandas' orient="table"), as the SDK's Result.data.
    assert isinstance(main.data, dict) and main.data["data"][0]["a"] == 1
    chart = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\n"
    )
    assert chart.error is None
    pngs = [r.png for r in chart.results if r.png]
    assert pngs, chart.results
    assert base64.b64decode(pngs[0]).startswith(PNG)


def test_contexts(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/home/user")
    assert ctx.language == "python"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    assert sbx.run_code("40 + 2", context=ctx).text == "42"
    sbx.restart_code_context(ctx)
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)


def test_contexts_keep_their_own_variables_and_directories(sbx: Sandbox) -> None:
    home = sbx.run_code("import os\nos.makedirs('ctx-a', exist_ok=True)\nos.getcwd()").text
    assert home is not None
    sbx.run_code("x = 'default'")
    one = sbx.create_code_context(cwd="/home/user/ctx-a")
    two = sbx.create_code_context()
    assert one.cwd == "/home/user/ctx-a" and two.cwd == "/home/user"
    assert sbx.run_code("x = 1", context=one).error is None
    assert sbx.run_code("x = 2", context=two).error is None
    assert sbx.run_code("x", context=one).text == "1"
    assert sbx.run_code("x", context=two).text == "2"
    assert sbx.run_code("x").text == "'default'"
    # Each context runs in its own directory; the default one stays where it was.
    assert sbx.run_code("import os\nos.getcwd()", context=one).text == f"'{home[1:-1]}/ctx-a'"
    assert sbx.run_code("import os\nos.getcwd()", context=two).text == home
    assert sbx.run_code("os.getcwd()").text == home
    # Files are the sandbox's, shared by every context (as on E2B).
    sbx.run_code("open('from-one.txt', 'w').write('one')", context=one)
    assert sbx.run_code("open('ctx-a/from-one.txt').read()").text == "'one'"
    # Restart empties the context, in its directory still; the others keep their state.
    sbx.restart_code_context(one)
    gone = sbx.run_code("x", context=one)
    assert gone.error is not None and gone.error.name == "NameError"
    assert sbx.run_code("import os\nos.getcwd()", context=one).text == f"'{home[1:-1]}/ctx-a'"
    assert sbx.run_code("x", context=two).text == "2"
    # Removed: the SDK's not-found error, and the default context untouched.
    sbx.remove_code_context(two)
    with pytest.raises(NotFoundException):
        sbx.run_code("x", context=two)
    assert sbx.run_code("x").text == "'default'"
    sbx.remove_code_context(one)
    # A bash context runs its commands in its directory.
    shell = sbx.create_code_context(cwd="/home/user/ctx-a", language="bash")
    assert sbx.run_code("pwd", context=shell).logs.stdout == [f"{home[1:-1]}/ctx-a\n"]
    sbx.remove_code_context(shell)


def test_bash_as_a_language(sbx: Sandbox) -> None:
    ex = sbx.run_code("echo from-bash", language="bash")
    assert ex.error is None
    assert ex.logs.stdout == ["from-bash\n"]


def test_unserved_language_is_refused(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="not served"):
        sbx.run_code("puts 1", language="ruby")
    # JavaScript and TypeScript are served: tests/e2b_compat/test_js_cells.py.


def test_policy_denial_is_an_execution_error_saying_why(sbx: Sandbox) -> None:
    ex = sbx.run_code("exec(bytes.fromhex('7072696e74283129').decode())")
    assert ex.error is not None
    assert ex.error.name == "PolicyDenied"
    assert "denied by profile 'strict'" in ex.error.value
    assert "py.dynamic-code" in ex.error.value or "computed" in ex.error.value


def test_needs_approval_names_the_approval_id(sbx: Sandbox, e2b_service: E2BService) -> None:
    ex = sbx.run_code("import socket\nsocket.gethostname()")
    assert ex.error is not None
    assert ex.error.name == "ApprovalRequired"
    assert "needs approval " in ex.error.value
    ticket = ex.error.value.split("needs approval ", 1)[1].split(" ", 1)[0]
    with ApprovalStore(e2b_service.proc.home / "approvals.sqlite3") as approvals:
        pending = approvals.get(ticket)
    assert pending.status == "pending"
    assert "socket" in pending.request.code
    with TenantStore.in_home(e2b_service.proc.home) as tenants:
        # Owned by the tenant's id, never its name.
        alice, bob = tenants.get("alice").id, tenants.get("bob").id
        assert tenants.owns(alice, "approval", ticket)
        assert not tenants.owns(bob, "approval", ticket)


# -- files ------------------------------------------------------------------------------------


def test_files_write_read_list_exists_remove_make_dir(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/data/sales.csv", "paid,leads\n3,10\n")
    assert info.path == "/home/user/data/sales.csv" and info.name == "sales.csv"
    sbx.files.write("/home/user/sales.csv", "paid,leads\n3,10\n")
    assert sbx.files.read("/home/user/sales.csv") == "paid,leads\n3,10\n"
    assert bytes(sbx.files.read("sales.csv", format="bytes")) == b"paid,leads\n3,10\n"
    names = {e.name: e for e in sbx.files.list("/home/user/data")}
    assert names["sales.csv"].type == FileType.FILE and names["sales.csv"].size == 16
    assert sbx.files.exists("/home/user/data/sales.csv")
    assert not sbx.files.exists("/home/user/data/missing.csv")
    assert sbx.files.make_dir("/home/user/out") is True
    assert sbx.files.make_dir("/home/user/out") is False
    assert sbx.files.get_info("/home/user/out").type == FileType.DIR
    sbx.files.write("/home/user/out/r.json", b'{"ok": true}')
    sbx.files.rename("/home/user/out/r.json", "/home/user/out/s.json")
    assert sbx.files.exists("/home/user/out/s.json")
    sbx.files.remove("/home/user/out")
    assert not sbx.files.exists("/home/user/out")
    # The code sees the same workspace.
    ex = sbx.run_code(
        "import pandas as pd\ndf = pd.read_csv('data/sales.csv')\n"
        "float(df.paid.sum() / df.leads.sum())"
    )
    assert ex.text == "0.3"
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/none.txt")


def test_reading_a_file_is_an_export_under_the_profiles_rules(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/job/script.py", "print(1)")
    # strict lets *.csv, *.txt... out of the top of the workspace and anything under out/.
    with pytest.raises(InvalidArgumentException, match="does not allow exporting"):
        sbx.files.read("/home/user/job/script.py")
    sbx.commands.run("mkdir -p out && cp job/script.py out/script.py")
    assert sbx.files.read("/home/user/out/script.py") == "print(1)"


def test_file_upload_forms_the_envd_version_allows(sbx: Sandbox) -> None:
    # envd 0.6.4 is reported: octet-stream and gzip uploads are used, and must work.
    assert sbx._envd_version == Version("0.6.4")
    sbx.files.write("/home/user/g.txt", "zipped", gzip=True)
    sbx.files.write("/home/user/o.txt", "streamed", use_octet_stream=True)
    assert sbx.files.read("/home/user/g.txt") == "zipped"
    assert sbx.files.read("/home/user/o.txt") == "streamed"


def test_paths_outside_the_workspace_are_the_sandboxs_own(sbx: Sandbox) -> None:
    # Not the host's: the sandbox's /etc (strict asks a person first, as for code reading it;
    # tests/e2b_compat/test_files_anywhere.py reads it), and its /tmp.
    sbx.files.write("/tmp/sync.txt", "tmp")
    assert sbx.files.read("/tmp/sync.txt") == "tmp"
    with pytest.raises(InvalidArgumentException, match="give a file path"):
        sbx.files.read("")


def test_a_symlink_out_of_the_workspace_is_not_followed_by_a_read(sbx: Sandbox) -> None:
    ex = sbx.run_code(
        "import os\nos.symlink('/etc', 'etc-link')\nos.symlink('/etc/hostname', 'host-link')"
    )
    assert ex.error is None, ex.error
    with pytest.raises(SandboxException) as read:
        sbx.files.read("/home/user/host-link")
    assert "root:" not in str(read.value)
    listed = {e.name: e for e in sbx.files.list("/home/user")}
    assert listed["host-link"].type == FileType.SYMLINK
    assert listed["etc-link"].symlink_target == "/etc"


# -- commands ---------------------------------------------------------------------------------


def test_commands_run_with_callbacks_cwd_and_envs(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sbx.files.make_dir("/home/user/cmd")
    sbx.files.write("/home/user/cmd/f.txt", "in the workspace")
    result = sbx.commands.run(
        'cat f.txt; echo; echo "$WHO" >&2; pwd',
        cwd="/home/user/cmd",
        envs={"WHO": "bash"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout.startswith("in the workspace\n")
    assert result.stdout.rstrip().endswith("/cmd")
    assert result.stderr == "bash\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == "bash\n"


def test_command_exit_status_raises_the_sdk_error(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo before; echo oops >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "before\n"
    assert info.value.stderr == "oops\n"


def test_command_denied_or_needing_approval_says_why(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match=r"denied by profile 'strict'.*sh\.destroy"):
        sbx.commands.run("rm -rf /")
    with pytest.raises(SandboxException, match=r"needs approval [0-9a-f]+ .*sh\.network"):
        sbx.commands.run("curl http://example.com")


def test_write_files_in_one_call(sbx: Sandbox) -> None:
    written = sbx.files.write_files(
        [
            WriteEntry(path="/home/user/many/a.txt", data="A"),
            WriteEntry(path="/home/user/many/b.txt", data=b"B"),
        ]
    )
    assert sorted(w.path for w in written) == ["/home/user/many/a.txt", "/home/user/many/b.txt"]
    assert sbx.commands.run("cat many/a.txt many/b.txt").stdout == "AB"


def test_command_timeout(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 20", timeout=1)
    # The sandbox goes on.
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_a_command_that_ended_is_not_listed(sbx: Sandbox) -> None:
    # Background commands, terminals and watches: tests/e2b_compat/test_processes.py.
    # The previous test's `sleep 20` is killed once the service sees its client gone, which
    # may come a moment after that test returned: wait for that event, not for a time.
    deadline = time.monotonic() + 120
    while sbx.commands.list() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sbx.commands.list() == []
    assert sbx.commands.kill(12345) is False


def test_read_as_a_stream(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/stream.txt", "x" * 100_000)
    chunks = sbx.files.read("/home/user/stream.txt", format="stream")
    assert b"".join(chunks) == b"x" * 100_000
