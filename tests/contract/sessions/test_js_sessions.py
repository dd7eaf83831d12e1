"""JavaScript and TypeScript sessions: a Node kernel (``_kernel.mjs``) kept across cells.

One JavaScript session checks what a notebook user relies on, cell after cell: names that
persist and may be declared again (a ``const`` too), top-level await, ESM imports of the
runtime's packages and of Node's built-ins, the last value as a rich output (JSON, records as a
table), output streamed while the cell runs, the interrupt of a synchronous loop (its time
limit) and of an await that never ends (a cancel) with the state kept, ``process.exit`` as the
cell's exit status, an error's stack at the cell's lines, scopes with their own globals and
directory. One TypeScript session runs typed cells. Cells of another language are refused
before anything runs.

On gVisor and in the microVM, where the same kernel runs under the rung's own plumbing (its
channel, its interrupt, its output relay), one JavaScript session checks fewer, denser cells:
names across cells, top-level await and lodash, output streamed, the last value, a loop
interrupted at its time limit with the state kept, the output cap, an error, the memory pause
refused and a files pause resumed under a fresh kernel, an export at the end; a TypeScript
session runs typed cells until one fills the session's memory.
"""

from __future__ import annotations

import json

import pytest
from tests.conftest import runtime_required
from tests.contract.sessions.rungs import only_on, open_session
from tests.contract.sessions.traces import trace

from sandcell import Executor, Limits, Outcome
from sandcell.backends.cell.state import PauseMode, PauseRefused
from sandcell.errors import ConfigError
from sandcell.sessions import Session
from sandcell.spec import MiB

_WASM = "the wasm rung runs Python only (Pyodide)"
_DENSER = (
    "its Node sessions are test_node_session_on_the_rung's and test_typescript_cells_on_the_"
    "rung's: fewer, denser cells (a session there costs seconds)"
)
NAMESPACES = only_on("namespaces", reason={"wasm": _WASM, "gvisor": _DENSER, "microvm": _DENSER})
OTHER_RUNGS = only_on(
    "gvisor",
    "microvm",
    reason={
        "namespaces": "covered by test_javascript_session and test_typescript_session",
        "wasm": _WASM,
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


@NAMESPACES
def test_javascript_session(ex: Executor) -> None:
    runtime_required("node")
    with open_session(ex, language="javascript", limits=LIMITS) as session:
        _check_cells(session)
        _check_interrupts(session)
        _check_ends(session)
        _check_scopes(session)
        _check_refusals(session, ex)


@NAMESPACES
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


@OTHER_RUNGS
def test_node_session_on_the_rung(rung: str, ex: Executor) -> None:
    runtime_required("node")
    s = open_session(ex, language="javascript", limits=Limits(stdout_bytes=4096))
    host = trace(rung, s)
    seen: list[tuple[str, str]] = []
    first = s.run(
        "import _ from 'lodash'\nlet x = 41\nconst xs = await Promise.resolve([1, 2, 3, 4])\n"
        "console.log('chunks', JSON.stringify(_.chunk(xs, 2)))",
        on_output=lambda stream, text: seen.append((stream, text)),
    )
    assert first.outcome is Outcome.OK, first.reason + first.stderr
    assert first.stdout == "chunks [[1,2],[3,4]]\n"
    assert "".join(text for stream, text in seen if stream == "stdout") == first.stdout
    assert _value(s, "_.sum(xs) + x") == "51"
    # The rung's interrupt (runsc kill, the guest agent's SIGINT) stops a synchronous loop.
    looped = s.run("let spins = 0\nwhile (true) { spins++ }", timeout_s=2)
    assert looped.outcome is Outcome.TIMEOUT, looped.reason
    assert "interrupted" in looped.reason and "kept" in looped.reason and s.ended is None
    flood = s.run("for (;;) console.log('x'.repeat(100))", timeout_s=30)
    assert flood.outcome is Outcome.OUTPUT_LIMIT, flood.reason
    assert flood.stdout_truncated and len(flood.stdout) <= 4096
    failed = s.run("null.field")
    assert failed.outcome is Outcome.ERROR and "TypeError" in failed.stderr
    assert _value(s, "require('node:fs').writeFileSync('out.txt', String(x))\nspins > 0") == "true"
    # A Node kernel's memory would copy its generators' state into every restore: its files
    # are kept, and come back under a fresh Node kernel.
    assert s.pause_modes == frozenset({PauseMode.FILES})
    with pytest.raises(PauseRefused, match=r"Math\.random"):
        s.fork(mode="memory")
    assert s.ended is None
    s.pause(mode="files")
    host.assert_gone()
    back = ex.resume(s.id)
    host = trace(rung, back)
    try:
        assert back.language == "javascript"
        assert _value(back, "typeof x + require('node:fs').readFileSync('out.txt', 'utf8')") == (
            "'undefined41'"
        )
        end = back.close(exports=["out.txt"])
    finally:
        back.close()
    assert [a.path for a in end.artifacts] == ["out.txt"]
    assert ex.store.path_for(end.artifacts[0].sha256).read_text() == "41"
    host.assert_gone()


@OTHER_RUNGS
def test_typescript_cells_on_the_rung(rung: str, ex: Executor) -> None:
    runtime_required("node")
    s = open_session(ex, language="typescript", limits=Limits(memory_bytes=384 * MiB))
    host = trace(rung, s)
    typed = s.run("interface P { x: number }\nconst p: P = { x: 2 }\nconsole.log(p.x * 21)")
    assert (typed.outcome, typed.stdout) == (Outcome.OK, "42\n"), typed.stderr
    assert _value(s, "const twice = (n: number): number => n * 2\ntwice(p.x)") == "4"
    # The session's memory limit, however it is met: the cgroup kills Node, or V8 aborts on a
    # heap it sized from the limit (the microVM's guest cgroup); the session ends either way.
    full = s.run("const kept: number[][] = []\nfor (;;) kept.push(new Array(1e6).fill(1.5))")
    assert full.outcome is Outcome.MEMORY_LIMIT, full.reason
    assert s.ended is not None and "session ended" in full.reason
    host.assert_gone()
