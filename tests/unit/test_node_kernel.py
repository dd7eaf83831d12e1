"""The Node kernel (``backends/inside/_kernel.mjs``) alone, through its channel, outside any
sandbox: the runtime's own Node.js and packages, with Node's permission flags as in a session.

What a session relies on: names that persist across cells and may be declared again, top-level
await, ESM and CommonJS imports, the last value as a rich output (a value, JSON, a table), the
interrupt of a synchronous loop and of an await with the state kept, process.exit as a status,
an error's stack at the cell's line, TypeScript, scopes with their own globals and directory.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandcell.backends.inside import NODE_KERNEL_SCRIPT
from sandcell.errors import ConfigError
from sandcell.runtimes.node.flags import NODE_FLAGS


def _node_tree() -> Path:
    from sandcell.runtimes.node import node_tree

    try:
        return node_tree()
    except ConfigError as exc:
        pytest.skip(f"the node runtime is not built here ({exc})")


class Kernel:
    """One kernel process and its channel."""

    def __init__(self, tree: Path, work: Path, *args: str) -> None:
        # The packages where a program's module resolution finds them: above its directory.
        (work / "node_modules").symlink_to(tree / "node_modules")
        self.work = work
        host, kernel = socket.socketpair()
        self.sock = host
        flags = [f for f in NODE_FLAGS if not f.startswith("--allow-fs-write")]
        self.proc = subprocess.Popen(
            [
                str(tree / "node" / "bin" / "node"),
                *flags,
                f"--allow-fs-write={work}",
                str(NODE_KERNEL_SCRIPT),
                "--modules",
                str(tree / "node_modules"),
                "--require-from",
                f"{work}/",
                *args,
            ],
            stdin=kernel.fileno(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=work,
            env={"PATH": "/usr/bin:/bin"},
        )
        kernel.close()
        self.buf = b""
        self.sock.settimeout(30)
        hello = self.recv()
        assert hello["op"] == "hello" and hello["pid"] == self.proc.pid, hello
        self.display = hello["display"]
        self.next_id = 0

    def recv(self) -> dict[str, Any]:
        while len(self.buf) < 4 or len(self.buf) < 4 + int.from_bytes(self.buf[:4], "big"):
            chunk = self.sock.recv(65536)
            assert chunk, f"the kernel closed its channel: {self.proc.stderr.read()!r}"  # type: ignore[union-attr]
            self.buf += chunk
        size = int.from_bytes(self.buf[:4], "big")
        msg = json.loads(self.buf[4 : 4 + size])
        self.buf = self.buf[4 + size :]
        assert isinstance(msg, dict)
        return msg

    def send(self, msg: dict[str, Any]) -> None:
        body = json.dumps(msg).encode()
        self.sock.sendall(len(body).to_bytes(4, "big") + body)

    def cell(
        self, code: str, *, interrupt: str | None = None, **extra: Any
    ) -> tuple[dict[str, Any], str, str]:
        """Run ``code``; with ``interrupt``, SIGINT once that text is on stdout (the cell is
        then surely running). The reply, stdout and stderr."""
        self.next_id += 1
        self.send({"op": "cell", "id": self.next_id, "code": code, **extra})
        started = self.recv()
        assert started == {"op": "started", "id": self.next_id}
        out = b""
        if interrupt is not None:
            assert self.proc.stdout is not None
            fd = self.proc.stdout.fileno()
            while interrupt.encode() not in out:
                assert select.select([fd], [], [], 30)[0], "the cell printed nothing"
                chunk = os.read(fd, 65536)
                assert chunk
                out += chunk
            os.kill(self.proc.pid, signal.SIGINT)
        reply = self.recv()
        assert reply["op"] == "done" and reply["id"] == self.next_id
        more_out, err = self._drain()
        return reply, (out + more_out).decode(), err.decode()

    def _drain(self) -> tuple[bytes, bytes]:
        # Everything a cell wrote is in the pipes before its reply.
        got = []
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            data = b""
            while True:
                try:
                    chunk = os.read(stream.fileno(), 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                data += chunk
            got.append(data)
        return got[0], got[1]

    def outputs(self, reply: dict[str, Any]) -> list[dict[str, Any]]:
        out_dir = Path(reply["out_dir"])
        return [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]

    def close(self) -> int:
        self.sock.close()
        status = self.proc.wait(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            stream.close()
        return status


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    tree = _node_tree()
    work = tmp_path_factory.mktemp("js")
    k = Kernel(tree, work, "--display", "--outputs", str(work / "outs"))
    try:
        yield k
    except BaseException:
        k.proc.kill()
        raise
    assert k.close() == 0  # the host closed the channel: the kernel ends, status 0


def test_names_persist_and_may_be_declared_again(kernel: Kernel) -> None:
    reply, _, err = kernel.cell("const a = 1; let b = 2\nvar c = 3\nfunction f(x) { return x * 2 }")
    assert reply["status"] == "ok", err
    reply, _, err = kernel.cell(
        "const a = 10; class K { v() { return a + b + c } }\nconst {p, q: [r]} = {p: 1, q: [2]}\n"
        "new K().v() + f(p + r)"
    )
    assert reply["status"] == "ok", err
    assert kernel.outputs(reply) == [{"kind": "value", "data": {"text/plain": "21"}, "files": []}]


def test_await_imports_and_output(kernel: Kernel) -> None:
    reply, out, err = kernel.cell(
        "import _ from 'lodash'\nimport { readFileSync } from 'node:fs'\nimport * as path from "
        "'node:path'\nconsole.log('before')\nawait new Promise((r) => setTimeout(r, 5))\n"
        "const chunks = _.chunk([1, 2, 3, 4], 2)\nfunction later() { return typeof readFileSync }\n"
        "({ chunks, base: path.basename('/a/b.txt') })"
    )
    assert reply["status"] == "ok", err
    assert out == "before\n"
    (shown,) = kernel.outputs(reply)
    assert shown["kind"] == "value"
    assert json.loads(shown["data"]["application/json"]) == {
        "chunks": [[1, 2], [3, 4]],
        "base": "b.txt",
    }
    # What the async cell declared is the session's, its functions included.
    reply, _, err = kernel.cell("require('lodash').VERSION === _.VERSION && later()")
    assert reply["status"] == "ok", err
    assert kernel.outputs(reply)[0]["data"]["text/plain"] == "'function'"


def test_records_are_a_table_and_undefined_shows_nothing(kernel: Kernel) -> None:
    reply, _, err = kernel.cell("[{ name: 'a', n: 1 }, { name: 'b', n: 2.5 }]")
    assert reply["status"] == "ok", err
    (table,) = kernel.outputs(reply)
    assert table["kind"] == "table"
    assert table["data"]["text/plain"].splitlines() == [
        "   name    n",
        "0     a    1",
        "1     b  2.5",
    ]
    assert "<table" in table["data"]["text/html"]
    doc = json.loads(table["data"]["application/json"])
    assert [f["name"] for f in doc["schema"]["fields"]] == ["index", "name", "n"]
    assert doc["data"][1] == {"index": 1, "name": "b", "n": 2.5}
    reply, _, _ = kernel.cell("let nothing = 1; console.log('x')")
    assert kernel.outputs(reply) == []


def test_interrupts_keep_the_state(kernel: Kernel) -> None:
    reply, _, err = kernel.cell(
        "let n = 0; while (true) { if (++n === 1000) console.log('looping') }",
        interrupt="looping",
    )
    assert reply["status"] == "interrupted", err
    reply, _, err = kernel.cell(
        # Said from a timer: the cell is waiting by then, past its synchronous part.
        "setTimeout(() => console.log('waiting')); await new Promise(() => {})",
        interrupt="waiting",
    )
    assert reply["status"] == "interrupted", err
    reply, _, _ = kernel.cell("n >= 1000")
    assert kernel.outputs(reply)[0]["data"]["text/plain"] == "true"


def test_errors_and_exit(kernel: Kernel) -> None:
    reply, _, err = kernel.cell("await 1\nfunction bad() {\n  return null.x\n}\nbad()")
    assert (reply["status"], reply["error"]) == ("error", "TypeError")
    lines = err.splitlines()
    assert lines[0].startswith("TypeError: Cannot read properties of null")
    assert "at bad (<cell" in lines[1] and lines[1].endswith(":3:15)")
    assert lines[2].strip().startswith("at <cell") and lines[2].endswith(":5:1")
    assert "kernel.mjs" not in err and "node:vm" not in err
    reply, _, err = kernel.cell("let = ;")
    assert (reply["status"], reply["error"]) == ("error", "SyntaxError")
    assert "SyntaxError" in err
    reply, _, _ = kernel.cell("process.exit(3)")
    assert (reply["status"], reply["exit_code"]) == ("exit", 3)
    reply, _, _ = kernel.cell("await null; process.exit()")
    assert (reply["status"], reply["exit_code"]) == ("exit", 0)
    reply, _, _ = kernel.cell("'still here'")
    assert kernel.outputs(reply)[0]["data"]["text/plain"] == "'still here'"


def test_scopes(kernel: Kernel) -> None:
    sub = kernel.work / "sub"
    sub.mkdir()
    reply, _, err = kernel.cell(
        "const only = 1; require('node:fs').writeFileSync('f.txt', 'x')", scope="s", cwd=str(sub)
    )
    assert reply["status"] == "ok", err
    assert (sub / "f.txt").read_text() == "x"
    reply, _, _ = kernel.cell("[typeof only, typeof a, process.cwd()]", scope="s")
    assert json.loads(kernel.outputs(reply)[0]["data"]["application/json"]) == [
        "number",
        "undefined",
        str(sub),
    ]
    reply, _, _ = kernel.cell("[typeof only, process.cwd()]")
    assert json.loads(kernel.outputs(reply)[0]["data"]["application/json"]) == [
        "undefined",
        str(kernel.work),
    ]
    kernel.send({"op": "drop", "id": 999, "scope": "s"})
    assert kernel.recv() == {"op": "done", "id": 999, "status": "ok"}
    reply, _, _ = kernel.cell("typeof only", scope="s")
    assert kernel.outputs(reply)[0]["data"]["text/plain"] == "'undefined'"


def test_typescript(tmp_path: Path) -> None:
    k = Kernel(_node_tree(), tmp_path, "--typescript")
    try:
        assert k.display is False
        reply, out, err = k.cell(
            "interface P { name: string }\nconst p: P = { name: 'ts' }\n"
            "function greet(x: P): string { return `hi ${x.name}` }\nconsole.log(greet(p))"
        )
        assert reply == {"op": "done", "id": 1, "status": "ok", "out_dir": None}, err
        assert out == "hi ts\n"
        reply, out, err = k.cell("enum Color { Red, Green }\nconsole.log(Color.Green as number)")
        assert (reply["status"], out) == ("ok", "1\n"), err
        reply, _, err = k.cell("let bad: = 1")
        assert (reply["status"], reply["error"]) == ("error", "SyntaxError"), err
    finally:
        assert k.close() == 0
