"""JavaScript and TypeScript through the official ``e2b_code_interpreter`` SDK: ``run_code``
with ``language="js"``, a TypeScript context, and ``run_code``'s timeout. Each JS/TS context
is a Node session of its own (sandcell.e2b.node_cells), whose files are not the sandbox's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService


def node_kernels_under(pid: int) -> int:
    """How many Node kernels (``kernel.mjs``) run among ``pid``'s descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = 0, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo.extend(children.get(child, []))
        try:
            cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        found += b"kernel.mjs" in cmdline
    return found


@pytest.fixture(scope="module")
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    # Unchecked: these tests are of the E2B surface, not of the js.* rules strict applies.
    sandbox = Sandbox.create(
        template="unchecked",
        envs={"GREETING": "hello"},
        api_key=e2b_service.alice,
        api_url=e2b_service.url,
        sandbox_url=e2b_service.url,
    )
    yield sandbox
    sandbox.kill()


def test_javascript_value_output_and_error(sbx: Sandbox) -> None:
    seen: list[str] = []
    ex = sbx.run_code(
        "console.log('hi', process.env.GREETING, process.cwd()); const x = 6 * 7; x",
        language="js",
        on_stdout=lambda m: seen.append(m.line),
    )
    assert ex.error is None
    assert ex.text == "42"
    assert ex.logs.stdout == ["hi hello /home/user\n"]
    assert seen == ["hi hello /home/user\n"]
    # The default JavaScript context keeps its names; an object is text and JSON.
    ex = sbx.run_code("({x, list: [1, 2]})", language="javascript")
    assert ex.results[0].json == {"x": 42, "list": [1, 2]}
    assert ex.text == "{ x: 42, list: [ 1, 2 ] }"
    # An error: name, message, stack; what the cell wrote before it is its output.
    ex = sbx.run_code("console.error('before'); missingName + 1", language="js")
    assert ex.error is not None
    assert ex.error.name == "ReferenceError"
    assert ex.error.value == "missingName is not defined"
    assert ex.error.traceback.startswith("ReferenceError: missingName is not defined\n    at ")
    assert ex.logs.stderr == ["before\n"]
    # Its files are its own: the sandbox's /home/user is the Python kernel's.
    sbx.files.write("/home/user/from-python.txt", "x")
    ex = sbx.run_code("require('node:fs').existsSync('/home/user/from-python.txt')", language="js")
    assert ex.text == "false"


def test_typescript_context_keeps_names_until_restarted(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="ts", cwd="/home/user/ts-work")
    assert ctx.language == "typescript"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    first = sbx.run_code("let n: number = 41; process.cwd()", context=ctx)
    assert first.error is None and first.text == "'/home/user/ts-work'"
    assert sbx.run_code("n + 1", context=ctx).text == "42"
    # The Python default context does not see it.
    assert sbx.run_code("'n' in globals()").text == "False"
    sbx.restart_code_context(ctx)
    gone: Any = sbx.run_code("typeof n", context=ctx)
    assert gone.text == "'undefined'"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_run_code_timeout_interrupts_the_javascript_cell(sbx: Sandbox) -> None:
    sbx.run_code("let kept = 'state'", language="js")
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="js", timeout=2)
    # The cell was interrupted when its client went away: the context answers, its names kept.
    ex = sbx.run_code("kept", language="js", timeout=60)
    assert ex.error is None
    assert ex.text == "'state'"


def test_kill_ends_the_sandboxs_node_sessions(sbx: Sandbox, e2b_service: E2BService) -> None:
    # Last in this module: the default JavaScript context's kernel is still running.
    service_pid = e2b_service.proc.proc.pid
    assert node_kernels_under(service_pid) >= 1
    sbx.kill()
    assert node_kernels_under(service_pid) == 0
