"""JavaScript and TypeScript sessions: a Node kernel (``_kernel.mjs``) kept across cells.

One JavaScript session checks what a notebook user relies on, cell after cell: names that
persist and may be declared again (a ``const`` too), top-level await, ESM imports of the
runtime's packages and of Node's built-ins, the last value as a rich output (JSON, records as a
table), output streamed while the cell runs, the interrupt of a synchronous loop (its time
limit) and of an await that never ends (a cancel) with the state kept, ``process.exit`` as the
cell's exit status, an error's stack at the cell's lines, scopes with their own globals and
directory. One TypeScript session runs typed cells. Cells of another language are refused
before anything runs.
"""

from __future__ import annotations

import json

import pytest
from tests.conftest import runtime_required
from tests.contract.sessions.rungs import only_on, open_session

from sandcell import Executor, Limits, Outcome
from sandcell.errors import ConfigError
from sandcell.sessions import Session
from sandcell.spec import MiB

pytestmark = only_on(
    "namespaces",
    reason={
        "wasm": "the wasm rung runs Python only (Pyodide)",
        "gvisor": "Node sessions on gVisor come with its session plumbing",
        "microvm": "Node sessions in the microVM come with its session plumbing",
    },
)

LIMITS = Limits(wall_time_s=60, memory_bytes=512 * MiB)


def _ok(session: Session, code: str, **options: object) -> list[dict[str, str]]:
    """Run ``code``; its rich outputs' data."""
    result = session.run(code, **options)  # type: ignore[arg-type]
    assert result.outcome is Outcome.OK, (result.reason, result.stderr)
    return [dict(o.data) for o in result.outputs]


def _value(session: Session, code: str, **options: object) -> str:
    [shown] = _ok(session, code, **options)
    return shown["text/plain"]


def _check_cells(session: Session) -> None:
    assert session.language == "javascript"
    assert session.info().language == "javascript"
    result = session.run("const a = 1; let b = 2; var c = 3\nfunction add(x, y) { return x + y }")
    assert (result.outcome, result.outputs) == (Outcome.OK, ()), result.stderr
    # Declared again, a const included, and read by the function of an earlier cell.
    assert _value(session, "const a = 10\nadd(a, b + c)") == "15"
    [shown] = _ok(
        session,
        "import _ from 'lodash'\nimport { readdirSync, writeFileSync } from 'node:fs'\n"
        "writeFileSync('made.txt', 'x')\nawait new Promise((r) => setTimeout(r, 5));\n"
        "({ chunks: _.chunk([1, 2, 3], 2), files: readdirSync('.').filter((f) => f === "
        "'made.txt') })",
    )
    assert json.loads(shown["application/json"]) == {"chunks": [[1, 2], [3]], "files": ["made.txt"]}
    # Imports are the session's names from then on; require works too.
    assert _value(session, "_.VERSION === require('lodash').VERSION") == "true"
    [table] = session.run("[{ city: 'Oslo', t: 4 }, { city: 'Rome', t: 18.5 }]").outputs
    assert table.kind == "table"
    doc = json.loads(table.data["application/json"])
    assert [f["name"] for f in doc["schema"]["fields"]] == ["index", "city", "t"]
    assert doc["data"][1] == {"index": 1, "city": "Rome", "t": 18.5}


def _check_interrupts(session: Session) -> None:
    # The cell's time limit: a synchronous loop is interrupted, the session and its state kept.
    loop = session.run("let n = 0\nwhile (true) { n++ }", timeout_s=1)
    assert loop.outcome is Outcome.TIMEOUT and "state are kept" in loop.reason, loop.reason
    assert _value(session, "n > 0") == "true"
    # Output streams while the cell runs: once it is seen, the never-ending await is cancelled.
    seen: list[str] = []

    def listen(stream: str, text: str) -> None:
        if stream == "stdout":
            seen.append(text)
        if "waiting" in text:
            session.cancel("seen")

    waiting = session.run(
        "setTimeout(() => console.log('waiting'))\nawait new Promise(() => {})", on_output=listen
    )
    assert waiting.outcome is Outcome.KILLED, waiting.reason
    assert waiting.reason.startswith("cancelled: seen")
    assert "".join(seen) == "waiting\n" == waiting.stdout
    assert _value(session, "a + n * 0") == "10"


def _check_ends(session: Session) -> None:
    exited = session.run("console.log('bye')\nprocess.exit(3)")
    assert (exited.outcome, exited.exit_code, exited.stdout) == (Outcome.ERROR, 3, "bye\n")
    failed = session.run("await null\nfunction f() {\n  return null.x\n}\nf()")
    assert failed.outcome is Outcome.ERROR and "TypeError" in failed.reason
    lines = failed.stderr.splitlines()
    assert lines[0].startswith("TypeError: Cannot read properties of null")
    assert "at f (<cell" in lines[1] and lines[1].endswith(":3:15)"), failed.stderr
    assert lines[2].endswith(":5:1"), failed.stderr
    assert _value(session, "a") == "10"


def _check_scopes(session: Session) -> None:
    home = _value(session, "process.cwd()").strip("'")
    _ok(session, "require('node:fs').mkdirSync('sub', { recursive: true })")
    _ok(session, "const a = 'scoped'", scope="one", cwd=f"{home}/sub")
    assert json.loads(
        _ok(session, "[a, typeof add, process.cwd()]", scope="one")[0]["application/json"]
    ) == ["scoped", "undefined", f"{home}/sub"]
    assert _value(session, "[a, process.cwd()].join(' ')") == f"'10 {home}'"
    session.drop_scope("one")
    assert _value(session, "typeof a", scope="one") == "'undefined'"


def _check_refusals(session: Session, ex: Executor) -> None:
    with pytest.raises(ConfigError, match="runs javascript cells, not python"):
        session.run("print(1)", language="python")
    with pytest.raises(ConfigError, match="runs no Bash cells"):
        session.run("echo hi", language="bash")
    with pytest.raises(ConfigError, match="set the environment or change directory"):
        session.run("1", env={"X": "1"})
    with pytest.raises(ConfigError, match="no background processes"):
        session.spawn("sleep 1")
    with pytest.raises(ConfigError, match="a session's language"):
        ex.session(language="bash")  # type: ignore[arg-type]
    assert session.cells == 18  # the refused cells never ran


def test_javascript_session(ex: Executor) -> None:
    runtime_required("node")
    with open_session(ex, language="javascript", limits=LIMITS) as session:
        _check_cells(session)
        _check_interrupts(session)
        _check_ends(session)
        _check_scopes(session)
        _check_refusals(session, ex)


def test_typescript_session(ex: Executor) -> None:
    runtime_required("node")
    with open_session(ex, language="typescript", limits=LIMITS) as session:
        _ok(
            session,
            "interface City { name: string; t: number }\n"
            "const cities: City[] = [{ name: 'Oslo', t: 4 }]\n"
            "function warmest(xs: City[]): string { return xs[0].name }",
        )
        assert _value(session, "enum Level { Low, High }\nwarmest(cities) + Level.High") == (
            "'Oslo1'"
        )
        typo = session.run("let x: = 1")
        assert typo.outcome is Outcome.ERROR and "SyntaxError" in typo.reason
        with pytest.raises(ConfigError, match="runs typescript cells, not javascript"):
            session.run("1", language="javascript")
