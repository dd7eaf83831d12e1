"""The run contract for JavaScript and TypeScript programs, on every rung that runs them.

Each test runs as root (the in-process executor) and as an ordinary user (``sandcell run --json
--lang ...``) on the namespaces and gVisor rungs and from the microVM pool (``NODE_PARAMS`` in
tests/conftest.py). A Node program starts cold on the namespaces and gVisor rungs (their warm
sandboxes are Python interpreters), which the record says; the wasm rung refuses it before the
run. Tests are few and dense: each sandbox run checks several things of the contract.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import Sandbox

from sandcell import ConfigError, Executor, RunRequest
from sandcell.artifacts import ArtifactStore

MiB = 1024 * 1024


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


def _seen(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON line the program printed last on stdout."""
    lines = [ln for ln in str(result["stdout"]).splitlines() if ln.strip()]
    assert lines, f"the program printed nothing; result: {result}"
    value: dict[str, Any] = json.loads(lines[-1])
    return value


def _show(r: dict[str, Any]) -> str:
    out, err = r["stdout"], r["stderr"]
    return f"{r['outcome']}: {r['reason']}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def _readable(path: Path) -> Path:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        p.chmod(p.stat().st_mode | (0o005 if p.is_dir() else 0o004))
    return path


def test_output_exit_status_and_the_record(node_sandbox: Sandbox) -> None:
    """stdout and stderr apart; ``process.exitCode``, ``process.exit`` and an uncaught error
    (status 1, its stack on stderr naming the program's line); the record names the Node
    runtime, and a warm rung says why the run started cold."""
    sb = node_sandbox
    r = sb.run(
        _code(
            """
            console.log("to stdout");
            console.error("to stderr");
            const seen = {
              version: process.version,
              execArgv: process.execArgv,
              cwd: process.cwd(),
              uid: process.getuid(),
              env: Object.keys(process.env).filter((k) => k.startsWith("NODE_")),
              child: process.permission.has("child"),
            };
            process.exitCode = 3;
            console.log(JSON.stringify(seen));
            """
        ),
        lang="javascript",
    )
    assert r["outcome"] == "error", _show(r)
    assert r["exit_code"] == 3, _show(r)
    assert str(r["stderr"]) == "to stderr\n"
    seen = _seen(r)
    assert str(r["stdout"]).startswith("to stdout\n")
    assert seen["version"].startswith("v22."), seen
    assert "--permission" in seen["execArgv"] and "--disable-sigusr1" in seen["execArgv"]
    assert seen["cwd"] == "/sandbox"
    assert seen["env"] == [], "no NODE_* variable reaches the program"
    assert seen["child"] is False
    runtime = r["runtime"]
    assert isinstance(runtime, dict) and runtime["name"] == "node", _show(r)
    assert len(str(runtime["tree_sha256"])) == 64
    layers = r["enforcement"]["layers"]  # type: ignore[index]
    assert "--permission" in layers["node_permissions"], layers

    r = sb.run(
        'console.log("before");\nprocess.exit(4);\nconsole.log("after");\n', lang="javascript"
    )
    assert (r["outcome"], r["exit_code"], r["stdout"]) == ("error", 4, "before\n"), _show(r)

    r = sb.run(
        'const x = 1;\nfunction f() {\n  throw new Error("boom");\n}\nf();\n', lang="javascript"
    )
    assert (r["outcome"], r["exit_code"]) == ("error", 1), _show(r)
    assert "Error: boom" in str(r["stderr"])
    assert "/sandcell/main.js:3" in str(r["stderr"]), r["stderr"]


def test_stdin_inputs_exports_and_packages(node_sandbox: Sandbox, tmp_path: Path) -> None:
    """stdin, an input at /inputs, a CommonJS ``require`` of a locked package from
    /node_modules, and files written in the workspace exported."""
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    _readable(data)
    r = node_sandbox.run(
        _code(
            """
            const fs = require("fs");
            const _ = require("lodash");
            const stdin = fs.readFileSync(0, "utf8");
            const rows = fs.readFileSync("/inputs/data.csv", "utf8").trim().split("\\n");
            const sums = _.sum(rows.slice(1).map((l) => Number(l.split(",")[1])));
            fs.mkdirSync("out", { recursive: true });
            fs.writeFileSync("out/report.txt", `rows ${rows.length}\\n`);
            fs.writeFileSync("/sandbox/result.json", JSON.stringify({ sums }));
            fs.writeFileSync("/tmp/scratch.txt", "not exported");
            console.log(JSON.stringify({ stdin, sums, lodash: require.resolve("lodash") }));
            """
        ),
        lang="javascript",
        stdin=b"from stdin\n",
        inputs=[data],
        exports=["out/*.txt", "*.json"],
    )
    assert r["outcome"] == "ok", _show(r)
    seen = _seen(r)
    assert seen == {"stdin": "from stdin\n", "sums": 6, "lodash": "/node_modules/lodash/lodash.js"}
    got = {a["path"]: a for a in r["artifacts"]}  # type: ignore[attr-defined]
    want = {"out/report.txt": b"rows 3\n", "result.json": b'{"sums":6}'}
    assert set(got) == set(want), r["artifacts"]
    store = ArtifactStore(node_sandbox.home / "artifacts")
    for path, content in want.items():
        assert got[path]["sha256"] == hashlib.sha256(content).hexdigest(), path
        assert store.path_for(got[path]["sha256"]).read_bytes() == content


def test_es_modules_and_top_level_await(node_sandbox: Sandbox) -> None:
    """A program with ``import`` and top-level ``await`` runs as an ES module, its packages
    found in /node_modules as for ``require``."""
    r = node_sandbox.run(
        _code(
            """
            import _ from "lodash";
            import { parse } from "yaml";
            import { readFile } from "node:fs/promises";
            const text = await readFile("/proc/self/status", "utf8");
            const doc = parse("a: [1, 2, 3]");
            console.log(JSON.stringify({
              chunks: _.chunk(doc.a, 2),
              esm: typeof require === "undefined",
              meta: import.meta.url,
              threads: Number(text.match(/Threads:\\s+(\\d+)/)[1]),
            }));
            """
        ),
        lang="javascript",
    )
    assert r["outcome"] == "ok", _show(r)
    seen = _seen(r)
    assert seen["chunks"] == [[1, 2], [3]]
    assert seen["esm"] is True
    assert seen["meta"] == "file:///sandcell/main.js"
    # Node's own threads (V8's workers, libuv's) count against max_pids: well under 64.
    assert 1 < seen["threads"] < 32, seen


def test_typescript_types_are_stripped_and_errors_are_clear(node_sandbox: Sandbox) -> None:
    """TypeScript runs with its types stripped (not checked); a syntax error and a construct
    that stripping cannot run (``enum``) fail with a message naming the program."""
    sb = node_sandbox
    r = sb.run(
        _code(
            """
            import _ from "lodash";
            interface Point { x: number; y: number }
            type Pair = [Point, Point];
            const pair: Pair = [{ x: 1, y: 2 }, { x: 3, y: 4 }];
            function norm(p: Point): number { return Math.hypot(p.x, p.y); }
            const wrong: string = 42 as unknown as string;
            console.log(JSON.stringify({ sum: _.sum(pair.map(norm)) > 0, wrong }));
            """
        ),
        lang="typescript",
    )
    assert r["outcome"] == "ok", _show(r)
    assert _seen(r) == {"sum": True, "wrong": 42}

    # A program that does not parse is refused before the run where the static checks parse
    # it too, else Node reports it; a module that does not parse, met at run time, fails as
    # Node reports it.
    r = sb.run("const x: number = ;\nconsole.log(x);\n", lang="typescript")
    if r["outcome"] == "denied":
        assert "line 1" in str(r["reason"]), _show(r)
    else:
        assert (r["outcome"], r["exit_code"]) == ("error", 1), _show(r)
        assert "/sandcell/main.ts:1" in str(r["stderr"]), _show(r)
        assert "ERR_INVALID_TYPESCRIPT_SYNTAX" in str(r["stderr"]), _show(r)
    r = sb.run(
        _code(
            """
            import { writeFileSync } from "node:fs";
            writeFileSync("/tmp/bad.ts", "const x: number = ;\\n");
            await import("/tmp/bad.ts");
            """
        ),
        lang="typescript",
    )
    assert (r["outcome"], r["exit_code"]) == ("error", 1), _show(r)
    err = str(r["stderr"])
    assert "/tmp/bad.ts" in err and "SyntaxError" in err, err

    r = sb.run("enum Color { Red, Green }\nconsole.log(Color.Red);\n", lang="typescript")
    assert (r["outcome"], r["exit_code"]) == ("error", 1), _show(r)
    assert "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX" in str(r["stderr"]), r["stderr"]


def test_wall_time_and_cpu_time_limits(node_sandbox: Sandbox) -> None:
    """A program waiting on a timer meets the wall-time limit, a spinning one the CPU-time
    limit; the output before the stop is kept. (Limits of a few seconds: Node spends over a
    second of CPU starting in a guest without KVM.)"""
    r = node_sandbox.run(
        'console.log("waiting");\nsetInterval(() => {}, 1000);\n', lang="javascript", wall_time_s=5
    )
    assert r["outcome"] == "timeout", _show(r)
    assert "wall" in str(r["reason"])
    assert r["stdout"] == "waiting\n"

    r = node_sandbox.run(
        'console.log("spin");\nwhile (true) {}\n', lang="javascript", cpu_time_s=3, wall_time_s=60
    )
    assert r["outcome"] == "timeout", _show(r)
    assert "cpu" in str(r["reason"]).lower(), _show(r)
    assert r["stdout"] == "spin\n"


def test_memory_limit(node_sandbox: Sandbox) -> None:
    """A program that fills memory ends as ``memory_limit``, whichever stops it first: the
    cgroup's limit (the kernel kills it) or V8's heap limit sized from it (V8 aborts)."""
    r = node_sandbox.run(
        _code(
            """
            console.log("allocating");
            const kept = [];
            while (true) kept.push(new Array(1 << 16).fill(Math.random()));
            """
        ),
        lang="javascript",
        memory_mb=128,
    )
    assert r["outcome"] == "memory_limit", _show(r)
    # "memory limit of N bytes reached", or "address-space limit of N bytes" (rlimits mode).
    assert f"limit of {128 * MiB} bytes reached" in str(r["reason"]), _show(r)
    assert str(r["stdout"]) == "allocating\n"


def test_output_caps(node_sandbox: Sandbox) -> None:
    """stdout and stderr each stop at their cap, the run ending as ``output_limit``."""
    r = node_sandbox.run(
        'process.stderr.write("small\\n");\nwhile (true) console.log("x".repeat(99));\n',
        lang="javascript",
        stdout_bytes=1000,
    )
    assert r["outcome"] == "output_limit", _show(r)
    assert r["stdout_truncated"] is True and r["stderr_truncated"] is False
    assert 0 < len(str(r["stdout"])) <= 1000
    assert set(str(r["stdout"])) <= {"x", "\n"}
    assert r["stderr"] == "small\n"


def test_node_threads_fit_max_pids_and_node_env_is_refused(node_sandbox: Sandbox) -> None:
    """Node needs about ten threads of its own (V8's workers, libuv's pool): the default
    ``max_pids`` (64) runs a program that uses libuv's pool, and a limit below 16 is refused
    before any run, as is a variable that changes how Node starts (``NODE_OPTIONS``)."""
    r = node_sandbox.run(
        _code(
            """
            const crypto = require("crypto");
            let done = 0;
            for (let i = 0; i < 8; i++) {
              crypto.pbkdf2("pw", "salt", 1000, 32, "sha256", () => {
                if (++done === 8) console.log(JSON.stringify({ done }));
              });
            }
            """
        ),
        lang="javascript",
    )
    assert r["outcome"] == "ok", _show(r)
    assert _seen(r) == {"done": 8}
    with pytest.raises(ConfigError, match="NODE_OPTIONS"):
        RunRequest(code="1", language="javascript", env={"NODE_OPTIONS": "--allow-worker"})
    # Fewer than Node's own threads would abort it or hang it until the wall time: refused.
    with pytest.raises(ConfigError, match="max_pids of at least 16"):
        node_sandbox.run("console.log(1)", lang="javascript", max_pids=8)


def test_wasm_rung_refuses_javascript(root_home: Path) -> None:
    """The wasm rung runs Python only: a JavaScript program is refused before the run, with a
    message that says so and names the rungs that run it."""
    from tests.conftest import backend_unavailable

    from sandcell.errors import IsolationUnavailable

    try:
        ex = Executor(home=root_home, profile="unchecked", backend="wasm")
    except IsolationUnavailable as exc:
        backend_unavailable("wasm", str(exc))
    with ex, pytest.raises(ConfigError) as err:
        ex.run(RunRequest(code="console.log(1)", language="javascript"))
    assert "runs Python only, not javascript" in str(err.value), err.value
    assert "Pyodide" in str(err.value)
